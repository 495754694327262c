"""Retries that resume: the example DAG loses a worker in the middle of training, after a
checkpoint exists; the task's retry (a new job on the same run directory) resumes from the newest
checkpoint, says which epoch, trains only the epochs left and reaches the accuracy bar."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.processes import start_ticks
from airflow_mpi.backends.sandbox import Sandbox
from tests.airflow_helpers import task_states, xcom
from tests.conftest import STATE_DIR

EPOCHS = 12
KILL_AFTER_EPOCH = 3  # the newest complete checkpoint must be at least this epoch when the worker dies


class WorkerKiller(threading.Thread):
    """Waits until a new run of the DAG has a complete checkpoint of epoch >= ``after``, then
    SIGKILLs the first worker pod of the job that trains (its whole pod: the PID namespace goes
    with its first process), as a lost node would. Records the epoch it saw and when."""

    def __init__(self, runs: Path, after: int, deadline_s: float = 300) -> None:
        super().__init__(daemon=True)
        self.runs, self.after, self.deadline = runs, after, time.monotonic() + deadline_s
        self.known = set(runs.glob("*")) if runs.exists() else set()
        self.seen_epoch: int | None = None
        self.victim: str | None = None
        self.killed_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            epoch = self._newest_checkpoint()
            if epoch is not None and epoch >= self.after and self._kill_a_worker():
                self.seen_epoch = epoch
                return
            time.sleep(0.05)

    def _newest_checkpoint(self) -> int | None:
        for run in set(self.runs.glob("*")) - self.known:
            latest = run / "checkpoints" / "latest"
            if latest.exists():
                return int(latest.read_text().strip().removeprefix("epoch"))
        return None

    def _kill_a_worker(self) -> bool:
        for job in STATE_DIR.iterdir() if STATE_DIR.exists() else []:
            sandbox = Sandbox.load(STATE_DIR, job.name) if job.is_dir() else None
            pods = sorted(name for name in (sandbox.pods if sandbox else {}) if "-worker-" in name)
            pod = sandbox.pods[pods[0]] if sandbox and pods else None
            if pod is None or pod.pid is None or start_ticks(pod.pid) != pod.pid_start:
                continue
            os.kill(pod.pid, signal.SIGKILL)
            self.victim, self.killed_at = pod.name, time.monotonic()
            return True
        return False


@pytest.fixture
def retrying_train(dagbag: Any) -> Iterator[Any]:
    """The example DAG with its train task retried at once (the DAG waits 10 s between tries);
    restored afterwards, since the DagBag is shared by the session."""
    dag = dagbag.get_dag("mpi_training_pipeline")
    train = dag.get_task("train")
    saved = train.retries, train.retry_delay
    train.retries, train.retry_delay = 1, timedelta(0)
    yield dag
    train.retries, train.retry_delay = saved


@pytest.mark.slow
@pytest.mark.usefixtures("no_leaks")
def test_a_retry_after_a_lost_worker_resumes_from_the_newest_checkpoint(
    retrying_train: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    killer = WorkerKiller(Path(os.environ["MPI_DEMO_DATA"]) / "runs", after=KILL_AFTER_EPOCH)
    killer.start()
    try:
        dag_run = retrying_train.test()
    finally:
        killer.stop.set()
        killer.join(5)
    out = capfd.readouterr().out
    assert killer.victim is not None and killer.seen_epoch is not None, "no worker was killed: " + out[-3000:]
    states = task_states(dag_run)
    assert states == {"preprocess": "success", "train": "success", "evaluate": "success"}, out[-5000:]

    # The first try failed on the lost worker, naming its pod and the signal.
    failed = rf"MPI job digits-[a-z2-7]{{13}} failed while training: pod {re.escape(killer.victim)} \(worker\) failed"
    assert re.search(failed + r", exit code -9, killed by SIGKILL", out), out[-5000:]
    # The retry resumed from the newest complete checkpoint: the one seen, or the next if the
    # ranks finished saving one more epoch before the kill landed.
    resumed = [int(m) for m in re.findall(rf"resumed from checkpoint epoch (\d+) \(of {EPOCHS}\)", out)]
    assert len(resumed) == 1, out[-5000:]
    epoch = resumed[0]
    assert killer.seen_epoch <= epoch <= killer.seen_epoch + 1 and epoch < EPOCHS
    train = xcom(dag_run, "train")
    assert train["result"]["resumed_from_epoch"] == epoch
    # Only the epochs left were trained again: epoch 1 ran once (the first try), the next after
    # the checkpoint twice at most (the first try may have started it), the last once.
    assert out.count("<stdout>:epoch 1/12 ") == 1
    assert out.count(f"<stdout>:epoch {epoch + 1}/12 ") in (1, 2)
    assert out.count("<stdout>:epoch 12/12 ") == 1
    assert xcom(dag_run, "evaluate") >= 0.85
    print(f"killed {killer.victim} after checkpoint epoch {killer.seen_epoch}; the retry resumed from epoch {epoch}")
