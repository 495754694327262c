"""testing of airflow-mpi."""
