"""One table of how a wait ends, run against both waits: ``MPIJobOperator`` waiting, and the
same operator deferrable (its trigger run to its event, then the resumed task). Each row is a
job and how its pods behave on the Kubernetes double; both ways must end with the same error
class and the same first line (the job's name aside): a worker never Ready past
``startup_timeout``, a worker that fails before its sshd answered or while training, and a job
past its ``timeout`` (counted from the training's start and ended ``TIMEOUT_GRACE`` past it,
both ways)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.exceptions import JobFailed, JobTimeout, SshdNotReady
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, first_trigger_event, job_objects, unique

UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
TRAINS = PodScript(lines=lambda: iter(["[1,0]<stdout>:training"]))  # runs until deleted


@dataclass(frozen=True)
class Row:
    """A job's fields, its pods' scripts (name part -> script), the error both waits end with,
    the start of its message, and how long either may take (seconds)."""

    fields: dict[str, Any]
    scripts: dict[str, PodScript]
    error: type[Exception]
    says: str
    within: float


TABLE = {
    "a worker never Ready": Row(
        {"startup_timeout": 3},
        {"-worker-0": PodScript(unschedulable=UNSCHEDULABLE), "-master-": TRAINS},
        SshdNotReady,
        "1 of 2 worker host(s) did not accept ssh within 3s",
        3 + 8,
    ),
    "a worker fails before its sshd answered": Row(
        {},
        {"-worker-1": PodScript(exit_code=1), "-master-": TRAINS},
        JobFailed,
        "MPI job {job} failed before sshd was ready: pod {job}-worker-1 (worker) failed, exit code 1",
        8,
    ),
    "a worker fails while training": Row(
        {},
        {"-worker-1": PodScript(fail_after=2.0, fail_exit_code=137, fail_reason="OOMKilled"), "-master-": TRAINS},
        JobFailed,
        "MPI job {job} failed while training: pod {job}-worker-1 (worker) failed, exit code 137, OOMKilled",
        2 + 8,
    ),
    "the job runs past its timeout": Row(
        {"timeout": 2},
        {"-master-": TRAINS},
        JobTimeout,
        "MPI job {job} ran past its timeout of 2s and was killed",
        2 + 3 + 8,
    ),
}


def end_of(double: KubeDouble, job: dict[str, Any], run_id: str, deferrable: bool) -> tuple[Exception, float]:
    """The error the task ends with, and how long it took."""
    from airflow_mpi.compat import TaskDeferred
    from airflow_mpi.operators.mpi import MPIJobOperator

    operator = MPIJobOperator(task_id="train", job=job, mpi_conn_id="mpi_k8s", deferrable=deferrable)
    context: Any = {"ti": SimpleNamespace(dag_id="rules", task_id="train", run_id=run_id, map_index=-1, try_number=1)}
    started = time.monotonic()
    try:
        try:
            operator.execute(context)
        except TaskDeferred as deferred:
            assert deferrable, "the waiting operator deferred"
            trigger: Any = deferred.trigger
            event = first_trigger_event(trigger)
            getattr(operator, deferred.method_name)(context, event)
    except Exception as error:
        return error, time.monotonic() - started
    raise AssertionError("the task succeeded")


@pytest.mark.usefixtures("connections")
@pytest.mark.parametrize("row", list(TABLE.values()), ids=list(TABLE))
def test_both_waits_end_alike(double: KubeDouble, scripts: Scripts, row: Row) -> None:
    for part, script in row.scripts.items():
        scripts.on(part, script)
    job = {
        "name": "rules",
        "image": "registry.example/train:1",
        "command": ["python", "/app/train.py"],
        "workers": {"replicas": 2},
        **row.fields,
    }
    ends = {}
    for deferrable in (False, True):  # a run each (the double plays a pod name once)
        ends[deferrable] = end_of(double, job, unique("rules"), deferrable)
        assert job_objects(double) == [], f"left after the {'deferred' if deferrable else 'waiting'} run"
    (waiting, waited), (deferred, deferred_took) = ends[False], ends[True]
    assert type(waiting) is row.error and type(deferred) is row.error, (repr(waiting), repr(deferred))
    first = [re.sub(r"rules-[a-z2-7]{13}", "{job}", str(error).splitlines()[0]) for error in (waiting, deferred)]
    assert first[0] == first[1], first
    assert first[0].startswith(row.says), first[0]
    assert waited < row.within and deferred_took < row.within, (waited, deferred_took)
