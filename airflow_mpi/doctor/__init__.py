"""``airflow-mpi doctor``: can this image (or this machine) run a job's pods?"""
