"""The deferred wait stays responsive whatever a job prints: a progress_pattern that backtracks
for seconds in Python's re, against a flood of 64 KiB lines, never stalls the triggerer's event
loop past 100 ms of its own CPU time (the pattern runs under RE2, each read step at most 64 KiB).
The loop's CPU time, not the wall clock's, is held to 100 ms: on a loaded machine the kernel
alone parks a thread for that long; the wall clock is held to a second, which Python's re on
this pattern and line would pass by orders of magnitude."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects, unique

LINE = 64 * 1024 - 64
FLOOD = 60  # lines of LINE characters: ~4 MB through the trigger's log follow


def hostile(double: KubeDouble) -> Iterator[str]:
    (master,) = [name[len("pods/") :] for name in job_objects(double) if name.startswith("pods/flood-")]
    yield "[airflow-mpi] starting mpiexec: 1 rank(s)"
    yield f"[1,0]<stdout>:AIRFLOW_MPI_RANK_START rank=0 size=1 host={master}"
    for index in range(FLOOD):
        text = ("a" * LINE + "!") if index % 2 else ("ab " * (LINE // 3) + "!")
        yield f"[1,0]<stdout>:{text}"
    yield '[1,0]<stdout>:AIRFLOW_MPI_RESULT {"flood": true}'


@pytest.mark.usefixtures("connections")
def test_a_backtracking_pattern_against_a_flood_never_stalls_the_trigger_loop(
    double: KubeDouble, scripts: Scripts
) -> None:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook  # noqa: F401
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_mpi.backends.kubernetes import KubernetesBackend
    from airflow_mpi.operators.mpi import MPIJobOperator
    from airflow_mpi.triggers.mpi import MPIJobTrigger
    from tests.k8s.conftest import api_client_for

    scripts.on("-master-", PodScript(lines=lambda: hostile(double), exit_code=0))
    job = {
        "name": "flood",
        "image": "registry.example/train:1",
        "command": ["python", "t.py"],
        "progress_timeout": 600,
        "progress_pattern": r"(a+)+$",
    }
    operator = MPIJobOperator(task_id="t", job=job, mpi_conn_id="mpi_k8s")
    operator.deferrable = True
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id=unique("flood"), map_index=-1, try_number=1)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute({"ti": ti})
    fired = deferred.value.trigger
    assert isinstance(fired, MPIJobTrigger)

    async def watch() -> tuple[Any, list[tuple[float, float]]]:
        stalls: list[tuple[float, float]] = []  # (wall, the loop thread's CPU) between two ticks
        done = asyncio.Event()

        async def ticker() -> None:
            last, last_cpu = time.perf_counter(), time.thread_time()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now, cpu = time.perf_counter(), time.thread_time()
                stalls.append((now - last - 0.005, cpu - last_cpu))
                last, last_cpu = now, cpu

        async def first_event() -> Any:
            try:
                async for event in fired.run():
                    return event.payload
            finally:
                done.set()

        payload, _ = await asyncio.gather(first_event(), ticker())
        return payload, stalls

    try:
        payload, stalls = asyncio.run(asyncio.wait_for(watch(), 120))
    finally:
        backend = KubernetesBackend(api_client=api_client_for(double), namespace="default")
        backend.teardown(fired.job_name)
        backend.leftovers(fired.job_name)
    assert payload["status"] == "finished", payload["status"]
    assert len(stalls) > 20  # the ticker ran through the flood
    wall, cpu = max(wall for wall, _ in stalls), max(cpu for _, cpu in stalls)
    assert cpu < 0.1, f"the loop spent {cpu * 1000:.0f} ms of CPU between two turns"
    assert wall < 1.0, f"the loop stalled {wall * 1000:.0f} ms"
    assert job_objects(double, fired.job_name) == []
