"""MPIJobOperator: one Airflow task = one MPI job (1 master + N workers), torn down on every path.

    train = MPIJobOperator(
        task_id="train",
        job={"name": "digits", "command": ["python", "/app/train.py"], "workers": {"replicas": 2}},
    )

``job`` is an ``MPIJobSpec`` or the same fields as a dict (templated). The task's run identity
names the job, so retries, backfills and mapped tasks never collide. The master's output streams
live into the task log; the return value (XCom) is a small result dict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_mpi.exceptions import BackendUnavailable, SpecError
from airflow_mpi.hooks.mpi import MPIJobHook
from airflow_mpi.naming import RunIdentity
from airflow_mpi.plan import render_plan
from airflow_mpi.runner import JobRunner
from airflow_mpi.spec import MPIJobSpec

if TYPE_CHECKING:
    from airflow.sdk import Context


class MPIJobOperator(BaseOperator):
    """Run an MPI training job (DeepSpeed, Horovod, mpi4py) and stream its output into the log.

    :param job: an ``MPIJobSpec``, or a dict with its fields (templated).
    :param mpi_conn_id: connection of type ``mpi`` choosing the backend; local if it does not exist.
    """

    template_fields: Sequence[str] = ("job", "mpi_conn_id")
    template_fields_renderers = {"job": "json"}
    ui_color = "#e8d4f0"

    def __init__(
        self,
        *,
        job: MPIJobSpec | Mapping[str, Any],
        mpi_conn_id: str = MPIJobHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if isinstance(job, MPIJobSpec):
            job = job.validated().to_dict()
        elif not isinstance(job, Mapping):
            raise TypeError(f"job must be an MPIJobSpec or a dict, not {type(job).__name__}")
        elif "{{" not in json.dumps(job, default=str):
            MPIJobSpec.from_dict(job)  # no templates: a bad spec fails the DAG import, not a run
        self.job = dict(job)
        self.mpi_conn_id = mpi_conn_id
        self._runner: JobRunner | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        try:
            spec = MPIJobSpec.from_dict(self.job)
            plan = render_plan(spec, run_identity(context))
            backend = MPIJobHook(self.mpi_conn_id).get_backend()
        except (SpecError, BackendUnavailable) as error:
            raise AirflowFailException(str(error)) from error  # retrying cannot fix these
        self._runner = JobRunner(backend, plan, emit=self._emit)
        result = self._runner.run()
        self.log.info(
            "MPI job %s succeeded in %ss (%s ranks)", result.job_name, result.durations_s.get("total"), result.np
        )
        return result.to_dict()

    def _emit(self, text: str) -> None:
        self.log.info("%s", text)

    def on_kill(self) -> None:
        if self._runner is not None:
            left = self._runner.teardown()
            self.log.info(
                "task killed: MPI job %s removed%s", self._runner.job_name, f" (left: {left})" if left else ""
            )


def run_identity(context: Context) -> RunIdentity:
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return RunIdentity(
        dag_id=ti.dag_id,
        task_id=ti.task_id,
        run_id=ti.run_id,
        map_index=-1 if map_index is None else int(map_index),
        try_number=int(getattr(ti, "try_number", 1) or 1),
    )
