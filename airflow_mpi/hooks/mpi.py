"""MPIJobHook: an Airflow connection (type ``mpi``) -> the backend that runs the job.

Connection extras: ``backend`` (``local``, ``kubernetes``, ``volcano`` or ``mpijob``), ``kubernetes_conn_id``,
``namespace``, ``api_timeout`` (seconds the Kubernetes API may stay silent before a wait gives
up), ``state_dir``, ``job_url_template`` (the task's "MPI job" link, e.g. a dashboard URL with
``{namespace}`` and ``{job}``). With no connection configured, the local backend is used, so the
example DAG runs as it is on one machine.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException, AirflowRuntimeError

from airflow_mpi.backends import BACKEND_NAMES, DEFAULT_BACKEND, KUBERNETES_KINDS
from airflow_mpi.backends.base import Backend
from airflow_mpi.exceptions import BackendUnavailable
from airflow_mpi.hooks.joblink import URL_TEMPLATE_EXTRA, check_url_template, render_job_url

BACKENDS = BACKEND_NAMES


class MPIJobHook(BaseHook):
    conn_name_attr = "mpi_conn_id"
    default_conn_name = "mpi_default"
    conn_type = "mpi"
    hook_name = "MPI job backend"

    def __init__(self, mpi_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.mpi_conn_id = mpi_conn_id
        # How messages name the connection. A connection test names it "this connection": the
        # UI and the REST API test a copy under a generated id the user has never seen.
        self._named = f"connection {mpi_conn_id!r}"

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
        extras = dict(connection.extra_dejson or {})
        problem = check_url_template(extras.get(URL_TEMPLATE_EXTRA))
        if problem:
            raise BackendUnavailable(f"{self._named}: extra {URL_TEMPLATE_EXTRA!r} {problem}")
        return extras

    def job_url(self, fields: dict[str, object]) -> str:
        """The job's link from the ``job_url_template`` extra ("" when the connection has none)."""
        template = self.connection_extras().get(URL_TEMPLATE_EXTRA)
        return render_job_url(template, fields) if template else ""

    def get_backend(self) -> Backend:
        extras = self.connection_extras()
        kind = extras.get("backend") or DEFAULT_BACKEND
        if kind == "local":
            from airflow_mpi.backends.local import LocalBackend

            return LocalBackend(state_dir=extras.get("state_dir"))
        if kind in KUBERNETES_KINDS:
            from airflow_mpi.backends.k8s_errors import API_TIMEOUT
            from airflow_mpi.backends.kubernetes import KubernetesBackend

            return KubernetesBackend(
                kubernetes_conn_id=extras.get("kubernetes_conn_id") or "kubernetes_default",
                namespace=extras.get("namespace"),
                kind=KUBERNETES_KINDS[kind],
                api_timeout=self._seconds(extras, "api_timeout", API_TIMEOUT),
            )
        raise BackendUnavailable(
            f"{self._named}: backend {kind!r} is unknown; set its extra 'backend' to one of {', '.join(BACKENDS)}"
        )

    def _seconds(self, extras: dict[str, Any], key: str, default: float) -> float:
        value = extras.get(key, default)
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = -1.0
        if not 1 <= seconds <= 86400:
            raise BackendUnavailable(
                f"{self._named}: extra {key!r} is {value!r}; set it to a number of seconds "
                f"from 1 to 86400 (default {default:.0f})"
            )
        return seconds

    def get_conn(self) -> Backend:
        return self.get_backend()

    def test_connection(self) -> tuple[bool, str]:
        """``airflow connections test``: local: the doctor's checks of this machine; Kubernetes:
        a real request listing pods in the namespace, saying what failed (unreachable, 401, 403
        with the verb and resource, a namespace that does not exist). Messages name the connection
        "this connection", never by the id Airflow generated for the test."""
        named, self._named = self._named, "this connection"
        try:
            backend = self.get_backend()
            if backend.name == "local":
                return self._test_local()
            from airflow_mpi.backends.cluster import check_access
            from airflow_mpi.backends.kubernetes import KubernetesBackend
            from airflow_mpi.spec import MPIJobSpec

            if not isinstance(backend, KubernetesBackend):
                return True, f"{backend.name} backend configured"
            return check_access(backend, backend.namespace_for(MPIJobSpec(name="check", command=("true",))))
        except Exception as error:
            return False, str(error)
        finally:
            self._named = named

    def _test_local(self) -> tuple[bool, str]:
        from airflow_mpi.doctor.run import run_local_doctor

        report = run_local_doctor()
        if report.ok:
            return True, f"local backend ready: {len(report.results)} checks passed on this machine"
        failed = [*report.missing, *(f"{r.check}: {r.detail}" for r in report.results if r.failed)]
        return False, "local backend not ready: " + "; ".join(failed)
