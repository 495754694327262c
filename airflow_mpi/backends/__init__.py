"""backends of airflow-mpi.

The names an ``mpi`` connection's extra ``backend`` takes: the hook builds a backend from one,
and the connection form offers exactly these, with the default preselected.
"""

BACKEND_NAMES = ("local", "kubernetes", "volcano", "mpijob")
DEFAULT_BACKEND = "local"  # what a connection without a backend, or no connection at all, runs on
# The job kind (``kinds.JobKind``) each Kubernetes backend name runs.
KUBERNETES_KINDS = {"kubernetes": "pods", "volcano": "volcano", "mpijob": "mpijob"}
