"""@task.mpi and mapped sweeps under real Airflow (dag.test()), on the local backend: the function
runs on every rank with its resolved arguments, rank 0's return value is the task's, and every
failure is clear and leaves nothing behind."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.airflow_helpers import task_states, xcom
from tests.k8s.test_mapped_tasks import task_instances

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_task_mpi_runs_on_every_rank_with_resolved_arguments(dagbag: Any, capfd: pytest.CaptureFixture[str]) -> None:
    dag_run = dagbag.get_dag("mpi_test_taskflow").test(run_conf={"word": "bonjour"})
    assert task_states(dag_run) == {"make_scale": "success", "allreduce": "success"}
    # XComArg (2.0) and template ("bonjour") resolved; 3 ranks each added (rank + 1) * 2.0.
    assert xcom(dag_run, "allreduce") == {"sum": 12.0, "size": 3, "word": "bonjour", "rank": 0}
    out = capfd.readouterr().out
    assert len(set(re.findall(r"rank (\d) of 3 on \S+-(master-0|worker-\d)", out))) == 3, out[-3000:]


def test_task_mpi_failures_are_clear(dagbag: Any, capfd: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    dag_run = dagbag.get_dag("mpi_test_taskflow_failures").test()
    took = time.monotonic() - started
    tasks = ("rank_raises", "raises_in_collective", "returns_a_set", "takes_too_much")
    assert task_states(dag_run) == dict.fromkeys(tasks, "failed")
    assert took < 120  # the rank that raised in a collective aborted the job, not its timeout
    out = capfd.readouterr().out
    collective = out[out.index("MPI job raises-in-collective-") :]
    assert "RuntimeError: rank 1 gives up" in collective, collective[:3000]
    # The raising rank's traceback, as the failure's "last lines of rank 1".
    assert re.search(r"rank 1 on pod rank-raises-[a-z2-7]{13}-worker-0 exited with code 1", out), out[-4000:]
    failure = out[out.index("last lines of rank 1") :]
    assert "Traceback (most recent call last)" in failure and "ValueError: bad batch on rank 1" in failure
    assert 'mpi_taskflow_dags.py", line' in failure  # the DAG file's own line numbers
    # A return value JSON cannot hold names its type and the fix.
    assert "return value is a set, which JSON cannot hold" in out
    # An argument over the ConfigMap's room: refused before anything is created, naming sizes.
    assert re.search(r"argument blob 1200002 bytes.*over the 983040 bytes", out), out[-4000:]
    assert "takes-too-much-" not in out.split("takes_too_much", 1)[-1].split("argument blob")[0]


def test_mapped_sweep_runs_one_job_per_index(dagbag: Any) -> None:
    timings = []
    for dag_id in ("mpi_test_taskflow_single", "mpi_test_taskflow_mapped", "mpi_test_taskflow_single"):
        started = time.monotonic()  # the first run also warms up (imports, connection, DB)
        run = dagbag.get_dag(dag_id).test()
        timings.append(time.monotonic() - started)
        if dag_id.endswith("single"):
            assert task_states(run) == {"single": "success"}
        else:
            dag_run = run
    instances = task_instances(dag_run)
    assert set(instances) == {("sweep", 0), ("sweep", 1), ("sweep", 2)}
    assert all(state == "success" for state, _ in instances.values()), instances
    results = [instances[("sweep", index)][1] for index in range(3)]
    assert [r["lr"] for r in results] == [0.1, 0.01, 0.001]
    assert all(r["np"] == 2 and re.fullmatch(r"sweep-[a-z2-7]{13}", r["job"]) for r in results), results
    assert len({r["job"] for r in results}) == 3
    print(f"dag.test() wall time: 1 job {timings[2]:.1f}s (cold {timings[0]:.1f}s), 3 mapped jobs {timings[1]:.1f}s")
