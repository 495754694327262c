"""The notice on the local backend, for real: a task killed while its job runs (the operator's
``on_kill``: ``JobRunner.teardown(notice=True)``) first has every pod run ``launch.sh notice``,
which sends each registered rank process SIGTERM, and gives the ranks the job's
``termination_grace`` to save before the pods go. Under Open MPI 4 (each rank the process the
wrapper exec'd) and MPICH (the wrapper stays each rank's parent); nothing left either way."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.runner.job import JobRunner
from tests.integration.test_local_backend import Log, make_plan
from tests.integration.test_mpi_implementations_local import DEBIAN_MPICH

# Each rank says it is up, then idles; on SIGTERM it "saves" for 1 s (a file in the shared
# directory) and exits 143, as a training script that checkpoints on the notice does.
SAVING_RANK = (
    'trap \'echo "rank $RANK saving"; sleep 1; echo saved > "$SHARED/rank$RANK"; exit 143\' TERM; '
    'echo "rank $RANK up"; while :; do sleep 0.1; done'
)
IGNORING_RANK = "trap '' TERM; echo \"rank $RANK up\"; while :; do sleep 0.1; done"


def run_quietly(runner: JobRunner) -> None:
    with contextlib.suppress(Exception):  # the job ends killed: its error is not what is tested
        runner.run()


def kill_when_up(backend: LocalBackend, shared: Path, script: str, **fields: Any) -> tuple[JobRunner, float, Log]:
    """Run the job in a thread; once every rank is up, tear it down with notice, as on_kill does.
    The seconds that teardown took."""
    log = Log()
    plan = make_plan(["bash", "-c", script], env={"SHARED": str(shared)}, **fields)
    runner = JobRunner(backend, plan, log)
    thread = threading.Thread(target=run_quietly, args=(runner,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while sum(" up" in line for line in log.lines) < 3:
        assert time.monotonic() < deadline, log.lines
        time.sleep(0.05)
    started = time.monotonic()
    left = runner.teardown(notice=True)
    seconds = time.monotonic() - started
    thread.join(30)
    assert left == [] and not thread.is_alive()
    return runner, seconds, log


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_a_killed_tasks_ranks_get_sigterm_and_time_to_save(backend: LocalBackend, shared_dir: Path, mpi: str) -> None:
    fields: dict[str, Any] = {"termination_grace": 20}
    if mpi == "mpich":
        fields["mpi"] = {"implementation": "mpich", "mpiexec": DEBIAN_MPICH}
    _, seconds, _ = kill_when_up(backend, shared_dir, SAVING_RANK, **fields)
    assert sorted(p.name for p in shared_dir.iterdir()) == ["rank0", "rank1", "rank2"]
    assert 1 <= seconds < 10, seconds  # each saved in 1 s, and the teardown did not wait out 20 s


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace(backend: LocalBackend, shared_dir: Path) -> None:
    _, seconds, _ = kill_when_up(backend, shared_dir, IGNORING_RANK, termination_grace=3)
    assert 3 <= seconds < 8, seconds


def test_no_notice_with_a_grace_of_0(backend: LocalBackend, shared_dir: Path) -> None:
    _, seconds, _ = kill_when_up(backend, shared_dir, SAVING_RANK, termination_grace=0)
    assert list(shared_dir.iterdir()) == [] and seconds < 5, seconds
