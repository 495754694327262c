"""Map indexes of one task run as separate jobs at the same time on the local backend: what an
executor does with a mapped MPI task's instances (dag.test() runs them one after another). Each
gets its own name and map-index label, its own result, and nothing is left."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.decorators.taskflow import FunctionCall, build_taskflow_files, function_source, runner_command
from airflow_mpi.job.naming import LABEL_MAP_INDEX, RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.runner.job import JobResult, JobRunner
from airflow_mpi.spec import MPIJobSpec

SWEEP = [
    "def sweep(lr):\n",
    "    import os, time\n",
    "    time.sleep(3)  # a little training\n",
    "    return {'lr': lr, 'size': int(os.environ['OMPI_COMM_WORLD_SIZE'])}\n",
]


def run_jobs(backend: LocalBackend, run_id: str, map_indexes: list[int]) -> tuple[float, dict[int, Any]]:
    results: dict[int, Any] = {}

    def run(index: int) -> None:
        lr = 10.0 ** -(index + 1)
        files = build_taskflow_files(FunctionCall(function_source("sweep", SWEEP, 1, "/dags/sweep.py"), [lr], {}))
        spec = MPIJobSpec.from_dict(
            {"name": "sweep", "command": runner_command(sys.executable), "workers": {"replicas": 1}, "files": files}
        )
        plan = render_plan(spec, RunIdentity("sweep_dag", "sweep", run_id, map_index=index))
        try:
            results[index] = (plan, JobRunner(backend, plan, emit=lambda _: None).run())
        except Exception as error:
            results[index] = (plan, error)

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(index,)) for index in map_indexes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return time.monotonic() - started, results


def test_three_map_indexes_run_concurrently_as_three_jobs(backend: LocalBackend) -> None:
    one, single = run_jobs(backend, f"one-{time.time_ns()}", [0])
    three, mapped = run_jobs(backend, f"three-{time.time_ns()}", [0, 1, 2])
    assert isinstance(single[0][1], JobResult), single
    assert all(isinstance(result, JobResult) for _, result in mapped.values()), mapped
    assert [mapped[i][1].result for i in range(3)] == [
        {"lr": 0.1, "size": 2},
        {"lr": 0.01, "size": 2},
        {"lr": 0.001, "size": 2},
    ]
    assert len({plan.job_name for plan, _ in mapped.values()}) == 3
    assert [mapped[i][0].labels[LABEL_MAP_INDEX] for i in range(3)] == ["0", "1", "2"]
    for plan, _ in mapped.values():
        assert backend.leftovers(plan.job_name) == []
    print(f"local backend: 1 job {one:.1f}s, 3 map indexes at once {three:.1f}s")
    assert three < 2.5 * one  # side by side, not one after another
