"""backends of airflow-mpi."""
