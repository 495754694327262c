"""The job flow, Airflow-free: create, sshd ready, master, stream, result, teardown on every path."""
