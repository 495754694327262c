"""The "MPI job" button on an MPI task in the Airflow UI: a link to the job in a cluster dashboard
or log viewer, from the ``mpi`` connection's ``job_url_template``.

The operator pushes the job's name and namespace to XCom (``LINK_XCOM_KEY``) when it submits the
job, before anything runs, so the link exists for a task that fails or is still running too;
Airflow calls ``get_link`` in the worker when the task ends and keeps what it returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

from airflow_mpi.joblink import LINK_XCOM_KEY

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class MPIJobLink(BaseOperatorLink):
    """Link to the task's MPI job; empty (no button) when the connection has no URL template."""

    name = "MPI job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        from airflow_mpi.hooks.mpi import MPIJobHook

        ref: Any = XCom.get_value(ti_key=ti_key, key=LINK_XCOM_KEY)
        if not isinstance(ref, dict) or not ref.get("job"):
            return ""  # the task ended before it submitted a job
        fields = {
            "job": ref["job"],
            "namespace": ref.get("namespace", ""),
            "dag_id": ti_key.dag_id,
            "task_id": ti_key.task_id,
            "run_id": ti_key.run_id,
            "try_number": ti_key.try_number,
        }
        return MPIJobHook(getattr(operator, "mpi_conn_id", MPIJobHook.default_conn_name)).job_url(fields)
