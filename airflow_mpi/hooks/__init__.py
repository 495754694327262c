"""hooks of airflow-mpi."""
