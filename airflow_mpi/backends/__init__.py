"""backends of airflow-mpi.

The names an ``mpi`` connection's extra ``backend`` takes: the hook builds a backend from one,
and the connection form and the CLI offer exactly these, with the default preselected. Every
Kubernetes backend runs one job kind, named in the kinds' registry (``kinds.registry``).
"""

from airflow_mpi.kinds.registry import KIND_ENTRIES, KIND_OF_BACKEND

DEFAULT_BACKEND = "local"  # what a connection without a backend, or no connection at all, runs on
# The job kind (``kinds.base.JobKind``) each Kubernetes backend name runs.
KUBERNETES_KINDS = dict(KIND_OF_BACKEND)
BACKEND_NAMES = (DEFAULT_BACKEND, *KUBERNETES_KINDS)
# What each backend is, in a few words (the connection form, the CLI's help).
BACKEND_SUMMARIES = {
    DEFAULT_BACKEND: "namespaced processes on this machine",
    **{entry.backend: entry.summary for entry in KIND_ENTRIES},
}


def describe_backends() -> str:
    """``'local' (...), 'kubernetes' (...) or 'mpijob' (...)``: every backend, for a form or a help."""
    named = [f"{name!r} ({summary})" for name, summary in BACKEND_SUMMARIES.items()]
    return f"{', '.join(named[:-1])} or {named[-1]}"
