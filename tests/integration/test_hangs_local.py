"""The hang watchdog on the local backend, for real: real Open MPI ranks that stop, skip a
collective or only print heartbeats are judged hung after ``progress_timeout``, every rank's
Python stack (faulthandler, through ``launch.sh stacks``) goes into the log, and the task fails
naming the silent rank; a healthy job is never touched; nothing is left.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.exceptions import JobHung
from airflow_mpi.observe.output import build_rank_pods
from airflow_mpi.runner.job import JobRunner
from tests.integration.test_local_backend import Log, make_plan

PY = sys.executable

# Every rank prints a step, then all-reduces in a function the stacks will name.
TRAINING = """
import os, signal, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
STOP_RANK, STOP_AT, SKIP_RANK = {stop_rank}, {stop_at}, {skip_rank}

def allreduce_step(step):
    return comm.allreduce(step)

def wait_for_batch():
    return comm.recv(source=0, tag=99)  # never sent: the rank that skipped waits here

for step in range({steps}):
    print(f"step {{step}} rank {{comm.rank}}", flush=True)
    if comm.rank == STOP_RANK and step == STOP_AT:
        os.kill(os.getpid(), signal.SIGSTOP)
    if comm.rank == SKIP_RANK and step == STOP_AT:
        wait_for_batch()
    allreduce_step(step)
    time.sleep({pause})
"""


def training(steps: int = 1000, stop_rank: int = -1, skip_rank: int = -1, stop_at: int = 3, pause: float = 0.3) -> str:
    return TRAINING.format(steps=steps, stop_rank=stop_rank, skip_rank=skip_rank, stop_at=stop_at, pause=pause)


def hung(backend: LocalBackend, log: Log, **fields: Any) -> tuple[JobHung, float, Any]:
    plan = make_plan(**fields)
    started = time.monotonic()
    with pytest.raises(JobHung) as caught:
        JobRunner(backend, plan, log).run()
    assert backend.leftovers(plan.job_name) == []
    return caught.value, time.monotonic() - started, plan


def stack_blocks(log: Log) -> dict[int, list[str]]:
    """rank -> the lines of its stack block in the log (``--- rank R on pod P, pid N:``)."""
    blocks: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in log.lines:
        match = re.match(r"^--- rank (\d+) ", line)
        if match:
            current = blocks.setdefault(int(match.group(1)), [])
            current.append(line)
        elif current is not None and line.startswith("    "):
            current.append(line)
        else:
            current = None
    return blocks


def test_a_stopped_rank_is_found_named_and_the_others_stacks_shown(backend: LocalBackend) -> None:
    log = Log()
    error, seconds, plan = hung(
        backend, log, command=[PY, "-c", training(stop_rank=1)], progress_timeout=8, timeout=300
    )
    pods = build_rank_pods(plan.spec, plan.topology)
    message = str(error)
    # Stopped after ~3 steps (~1 s of training, a few seconds of start): progress_timeout + 15 s.
    assert seconds < 8 + 15 + 10, (seconds, message)
    assert error.rank == 1 and error.pod == pods[1], message
    assert f"rank 1 on pod {pods[1]} did not answer: the process is stopped" in message, message
    assert "no rank printed a line for 8s (progress_timeout)" in message, message
    assert re.search(r"rank 0 on pod \S+: quiet for \d+s; last line: step \d+ rank 0", message), message
    blocks = stack_blocks(log)
    assert sorted(blocks) == [0, 1, 2], blocks
    for rank in (0, 2):
        text = "\n".join(blocks[rank])
        assert "most recent call first" in text and "in allreduce_step" in text, text
    assert "did not answer: the process is stopped" in blocks[1][0], blocks[1]


def test_a_rank_that_skips_a_collective_shows_where_each_waits(backend: LocalBackend) -> None:
    log = Log()
    error, _, _ = hung(backend, log, command=[PY, "-c", training(skip_rank=2)], progress_timeout=6, timeout=300)
    blocks = stack_blocks(log)
    assert "in allreduce_step" in "\n".join(blocks[0]) and "in allreduce_step" in "\n".join(blocks[1]), blocks
    assert "in wait_for_batch" in "\n".join(blocks[2]), blocks[2]
    assert "Did not answer" not in str(error), str(error)  # every rank answered: all are in Python


def test_heartbeats_that_the_pattern_does_not_match_are_no_progress(backend: LocalBackend) -> None:
    program = "import time\nwhile True:\n    print('heartbeat', flush=True)\n    time.sleep(0.5)\n"
    log = Log()
    error, seconds, _ = hung(
        backend, log, command=[PY, "-c", program], progress_timeout=5, progress_pattern=r"^step \d+", timeout=300
    )
    message = str(error)
    assert "no rank printed a line matching progress_pattern for 5s" in message, message
    assert "last line: heartbeat" in message, message
    assert seconds < 5 + 15 + 10, seconds


def test_with_a_pattern_one_rank_silent_while_the_others_go_on_is_hung(backend: LocalBackend) -> None:
    # No collectives: ranks 0 and 2 go on stepping; rank 1 stops printing steps after two.
    program = (
        "import os, time\nrank = int(os.environ['RANK'])\nstep = 0\n"
        "def stuck_loading_data():\n    while True:\n        time.sleep(0.5)\n"
        "while True:\n    print(f'step {step}', flush=True)\n    step += 1\n"
        "    if rank == 1 and step == 2:\n        stuck_loading_data()\n    time.sleep(0.3)\n"
    )
    log = Log()
    error, _, plan = hung(
        backend, log, command=[PY, "-c", program], progress_timeout=5, progress_pattern=r"^step \d+", timeout=300
    )
    pods = build_rank_pods(plan.spec, plan.topology)
    message = str(error)
    assert "rank(s) 1 printed no line matching progress_pattern for 5s" in message, message
    assert error.rank == 1 and error.pod == pods[1], message
    assert "in stuck_loading_data" in "\n".join(stack_blocks(log)[1]), log.lines[-40:]


def test_a_healthy_job_that_prints_every_few_seconds_is_never_touched(backend: LocalBackend) -> None:
    log = Log()
    plan = make_plan(
        command=[PY, "-c", training(steps=6, pause=2.0)], progress_timeout=5, progress_pattern=r"^step", timeout=300
    )
    result = JobRunner(backend, plan, log).run()
    assert result.exit_code == 0
    assert not any("looks hung" in line or line.startswith("--- rank") for line in log.lines), log.lines
    assert sum(line.endswith("step 5 rank 0") for line in log.lines) == 1


def stacks_while_it_trains(
    runner: JobRunner, lines: Callable[[], list[str]], cli: list[str], start_within: float
) -> tuple[int, list[Any]]:
    """Run the job in a thread; once rank 0 printed step 2, ``airflow-mpi <cli>``; then wait for
    the job. The command's exit code, and the job's result when it succeeded."""
    from airflow_mpi.cli.main import main

    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(runner.run()))
    thread.start()
    try:
        deadline = time.monotonic() + start_within
        while not any(line.endswith("step 2 rank 0") for line in lines()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return main(cli), results
    finally:
        thread.join(300)


def test_airflow_mpi_stacks_prints_a_running_jobs_stacks_and_the_job_goes_on(
    backend: LocalBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = make_plan(command=[PY, "-c", training(steps=40, pause=0.25)], timeout=300)
    log = Log()
    cli = ["stacks", plan.job_name, "--state-dir", str(backend.state_dir), "--wait", "3"]
    code, results = stacks_while_it_trains(JobRunner(backend, plan, log), lambda: log.lines, cli, 60)
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"Python stacks of job {plan.job_name}" in out
    pods = build_rank_pods(plan.spec, plan.topology)
    for rank in range(3):
        assert f"--- rank {rank} on {pods[rank]}" in out or f"--- rank {rank} on pod {pods[rank]}" in out, out
    assert out.count("most recent call first") >= 3, out
    assert results and results[0].exit_code == 0  # asked, not stopped: it trained to the end
    assert sum(line.endswith("step 39 rank 0") for line in log.lines) == 1
