"""sensors of airflow-mpi."""
