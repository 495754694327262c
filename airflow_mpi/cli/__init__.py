"""The ``airflow-mpi`` command line."""
