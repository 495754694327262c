"""operators of airflow-mpi."""
