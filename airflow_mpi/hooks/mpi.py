"""MPIJobHook: an Airflow connection (type ``mpi``) -> the backend that runs the job.

Connection extras: ``backend`` (``local``, ``kubernetes``, ``volcano`` or ``mpijob``), ``kubernetes_conn_id``,
``namespace``, ``api_timeout`` (seconds the Kubernetes API may stay silent before a wait gives
up), ``state_dir``, ``job_url_template`` (the task's "MPI job" link, e.g. a dashboard URL with
``{namespace}`` and ``{job}``), ``nccl_ib_env`` (the ``NCCL_IB_*`` variables of the cluster's
InfiniBand, written into every pod).

A connection id that does not exist is an error naming it and how to create it, before anything
is created: a mistyped ``mpi_conn_id`` must never start sshd and the training on the Airflow
worker. The one exception is the default id, ``mpi_default``: without it the local backend is
used (with a warning that says so), so the example DAG runs as it is on one machine.
"""

from __future__ import annotations

import json
import re
from typing import Any

from airflow.sdk.exceptions import AirflowRuntimeError

from airflow_mpi.backends import BACKEND_NAMES, DEFAULT_BACKEND, KUBERNETES_KINDS
from airflow_mpi.backends.base import Backend
from airflow_mpi.compat import AirflowNotFoundException, BaseHook
from airflow_mpi.exceptions import BackendUnavailable
from airflow_mpi.hooks.connection_form import HIDDEN_FIELDS, build_form_widgets, unprefixed
from airflow_mpi.hooks.joblink import URL_TEMPLATE_EXTRA, check_url_template, render_job_url

BACKENDS = BACKEND_NAMES
NCCL_IB_EXTRA = "nccl_ib_env"
NCCL_IB_NAME = re.compile(r"^NCCL_IB_[A-Z0-9_]+$")
_WARNED_MISSING: set[str] = set()  # the missing default connection is warned about once a process


def check_nccl_ib_env(value: object) -> str | None:
    """What is wrong with a ``nccl_ib_env`` extra (None: fine)."""
    if not isinstance(value, dict):
        return f'is {value!r:.60}; give an object of NCCL_IB_* names and string values, e.g. {{"NCCL_IB_HCA": "mlx5"}}'
    wrong = [name for name in value if not isinstance(name, str) or not NCCL_IB_NAME.match(name)]
    if wrong:
        return f"names {wrong[0]!r}; it holds NCCL_IB_* variables only (NCCL_IB_ and capitals, digits, _)"
    bad = [name for name, text in value.items() if not isinstance(text, str)]
    if bad:
        return f'gives {bad[0]} the value {value[bad[0]]!r:.40}; give strings, e.g. "3"'
    return None


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
        """The connection's extras; ``{}`` (the local backend) when the default connection does not
        exist. Any other id that does not exist is an error: ``BackendUnavailable``, saying how to
        create it."""
        if not self.mpi_conn_id:
            return {}
        try:
            connection = self.get_connection(self.mpi_conn_id)
        except (AirflowNotFoundException, AirflowRuntimeError) as error:
            if isinstance(error, AirflowRuntimeError) and "NOT_FOUND" not in str(error).upper():
                raise
            if self.mpi_conn_id != self.default_conn_name:
                raise BackendUnavailable(render_missing_connection(self.mpi_conn_id)) from error
            if self.mpi_conn_id not in _WARNED_MISSING:  # once a process: a task's hooks ask again
                _WARNED_MISSING.add(self.mpi_conn_id)
                self.log.warning(
                    "No connection %r: this job runs on the local backend, in namespaces on this Airflow "
                    "worker. To run it on Kubernetes, create the connection (%s)",
                    self.mpi_conn_id,
                    how_to_create(self.mpi_conn_id),
                )
            return {}
        extras = unprefixed(dict(connection.extra_dejson or {}))
        problem = check_url_template(extras.get(URL_TEMPLATE_EXTRA))
        if problem:
            raise BackendUnavailable(f"{self._named}: extra {URL_TEMPLATE_EXTRA!r} {problem}")
        return extras

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The form's fields on Airflow 3.0 and 3.1 (later releases read them from the provider info)."""
        return build_form_widgets()

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The standard fields the form hides, on Airflow 3.0 and 3.1."""
        return {"hidden_fields": list(HIDDEN_FIELDS), "relabeling": {}}

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
                platform_env=self._nccl_ib_env(extras),
            )
        raise BackendUnavailable(
            f"{self._named}: backend {kind!r} is unknown; set its extra 'backend' to one of {', '.join(BACKENDS)}"
        )

    def _nccl_ib_env(self, extras: dict[str, Any]) -> dict[str, str]:
        """``nccl_ib_env``: the ``NCCL_IB_*`` variables this cluster's InfiniBand needs, written
        into every pod (as the training platform writes them; a job's spec may not)."""
        value = extras.get(NCCL_IB_EXTRA) or {}
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                value = None
        problem = check_nccl_ib_env(value)
        if problem or not isinstance(value, dict):
            raise BackendUnavailable(f"{self._named}: extra {NCCL_IB_EXTRA!r} {problem}")
        return {str(name): str(text) for name, text in value.items()}

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


def how_to_create(conn_id: str) -> str:
    """The two ways to create connection ``conn_id`` (for the Kubernetes backend)."""
    extras = '{"backend": "kubernetes", "kubernetes_conn_id": "kubernetes_default", "namespace": "training"}'
    return (
        f"airflow connections add {conn_id} --conn-type mpi --conn-extra '{extras}', or the environment "
        f'variable AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": "mpi", "extra": {extras}}}\'; '
        'the extra "backend": "local" runs the job on the Airflow worker instead'
    )


def render_missing_connection(conn_id: str) -> str:
    """The task's error for an ``mpi_conn_id`` that names no connection."""
    return (
        f"connection {conn_id!r} does not exist, so there is no backend to run the job on (nothing was "
        f"created). Check the spelling of mpi_conn_id, or create it: {how_to_create(conn_id)}. Only the "
        f"default id {MPIJobHook.default_conn_name!r} falls back to the local backend when it is missing"
    )
