"""MPIJobHook: an Airflow connection (type ``mpi``) -> the backend that runs the job.

Connection extras: ``backend`` (``local``, ``kubernetes``, ``volcano`` or ``mpijob``), ``kubernetes_conn_id``,
``namespace``, ``api_timeout`` (seconds the Kubernetes API may stay silent before a wait gives
up), ``state_dir``. With no connection configured, the local backend is used, so the
example DAG runs as it is on one machine.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException, AirflowRuntimeError

from airflow_mpi.backends.base import Backend
from airflow_mpi.exceptions import BackendUnavailable

BACKENDS = ("local", "kubernetes", "volcano", "mpijob")


class MPIJobHook(BaseHook):
    conn_name_attr = "mpi_conn_id"
    default_conn_name = "mpi_default"
    conn_type = "mpi"
    hook_name = "MPI job backend"

    def __init__(self, mpi_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.mpi_conn_id = mpi_conn_id

    def connection_extras(self) -> dict[str, Any]:
        """The connection's extras; ``{}`` when no such connection exists (local defaults)."""
        if not self.mpi_conn_id:
            return {}
        try:
            connection = self.get_connection(self.mpi_conn_id)
        except (AirflowNotFoundException, AirflowRuntimeError) as error:
            if isinstance(error, AirflowRuntimeError) and "NOT_FOUND" not in str(error).upper():
                raise
            self.log.info("No connection %r: using the local backend", self.mpi_conn_id)
            return {}
        return dict(connection.extra_dejson or {})

    def get_backend(self) -> Backend:
        extras = self.connection_extras()
        kind = extras.get("backend") or "local"
        if kind == "local":
            from airflow_mpi.backends.local import LocalBackend

            return LocalBackend(state_dir=extras.get("state_dir"))
        if kind == "volcano":
            from airflow_mpi.backends.k8s_errors import API_TIMEOUT
            from airflow_mpi.backends.volcano import VolcanoBackend

            return VolcanoBackend(
                kubernetes_conn_id=extras.get("kubernetes_conn_id") or "kubernetes_default",
                namespace=extras.get("namespace"),
                api_timeout=self._seconds(extras, "api_timeout", API_TIMEOUT),
            )
        if kind == "mpijob":
            from airflow_mpi.backends.k8s_errors import API_TIMEOUT
            from airflow_mpi.backends.mpijob import MPIJobBackend

            return MPIJobBackend(
                kubernetes_conn_id=extras.get("kubernetes_conn_id") or "kubernetes_default",
                namespace=extras.get("namespace"),
                api_timeout=self._seconds(extras, "api_timeout", API_TIMEOUT),
            )
        if kind == "kubernetes":
            from airflow_mpi.backends.k8s_errors import API_TIMEOUT
            from airflow_mpi.backends.kubernetes import KubernetesBackend

            return KubernetesBackend(
                kubernetes_conn_id=extras.get("kubernetes_conn_id") or "kubernetes_default",
                namespace=extras.get("namespace"),
                api_timeout=self._seconds(extras, "api_timeout", API_TIMEOUT),
            )
        raise BackendUnavailable(
            f"connection {self.mpi_conn_id!r}: backend {kind!r} is unknown; set its extra 'backend' to one of "
            f"{', '.join(BACKENDS)}"
        )

    def _seconds(self, extras: dict[str, Any], key: str, default: float) -> float:
        value = extras.get(key, default)
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = -1.0
        if not 1 <= seconds <= 86400:
            raise BackendUnavailable(
                f"connection {self.mpi_conn_id!r}: extra {key!r} is {value!r}; set it to a number of seconds "
                f"from 1 to 86400 (default {default:.0f})"
            )
        return seconds

    def get_conn(self) -> Backend:
        return self.get_backend()

    def test_connection(self) -> tuple[bool, str]:
        try:
            backend = self.get_backend()
        except Exception as error:
            return False, str(error)
        if backend.name == "local":
            from airflow_mpi.backends.local import check_prerequisites

            problems = check_prerequisites()
            return (not problems, "local backend ready" if not problems else "missing: " + "; ".join(problems))
        return True, f"{backend.name} backend configured"
