"""triggers of airflow-mpi."""
