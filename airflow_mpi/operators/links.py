"""The "MPI job" button on an MPI task in the Airflow UI: a link to the job in a cluster dashboard
or log viewer, from the ``mpi`` connection's ``job_url_template``.

Airflow 3 shows a task's links on its Details tab, from what is stored under the link's XCom key
(``xcomkeys.JOB_LINK``); it calls ``get_link`` in the worker when the task ends and stores the
answer. The operator stores the same link as soon as it submits the job (``store_job_link``),
so the button is there while the job runs, and for a task that fails later too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

from airflow_mpi.compat import store_link
from airflow_mpi.operators.xcomkeys import JOB_LINK, JOB_REF

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class MPIJobLink(BaseOperatorLink):
    """Link to the task's MPI job; empty (no button) when the connection has no URL template."""

    name = "MPI job"

    @property
    def xcom_key(self) -> str:
        return JOB_LINK

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        ref: Any = XCom.get_value(ti_key=ti_key, key=JOB_REF)
        if not isinstance(ref, dict) or not ref.get("job"):
            return ""  # the task ended before it submitted a job
        return job_url(getattr(operator, "mpi_conn_id", None), ref, ti_key)


def job_url(conn_id: str | None, ref: dict[str, Any], ti: Any) -> str:
    """The link to the job ``ref`` names ({"job", "namespace"}) for the task instance ``ti`` (a
    TaskInstanceKey or a running task instance: its ids and try number); "" without a template."""
    from airflow_mpi.hooks.mpi import MPIJobHook

    fields = {
        "job": ref["job"],
        "namespace": ref.get("namespace", ""),
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "try_number": ti.try_number,
    }
    return MPIJobHook(conn_id or MPIJobHook.default_conn_name).job_url(fields)


def store_job_link(conn_id: str | None, ref: dict[str, Any], ti: Any) -> str:
    """Store the link under the key the UI reads, now, rather than only when the task ends.
    Written as Airflow writes links (``compat.store_link``)."""
    url = job_url(conn_id, ref, ti)
    if url:
        store_link(ti, JOB_LINK, url)
    return url
