"""What the Airflow UI shows of the example DAG, through Airflow's own parts: the evaluate task's
log as Airflow's log reader serves it to the log page (the task run by Airflow's supervisor, which
reads printed lines and log records apart), and what unpausing the DAG schedules."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.conftest import REPO


def _trained_model(run_dir: Path) -> None:
    """test.npz and the weights (model.npz) that pass the bar, as preprocess and train leave them; in a
    child process, so this one never starts torch's threads (the supervisor forks)."""
    code = textwrap.dedent(
        f"""
        import numpy as np, torch
        from sklearn.datasets import load_digits
        digits = load_digits()
        x, y = (digits.data / 16.0).astype("float32"), digits.target
        np.savez({str(run_dir / "test.npz")!r}, x=x, y=y)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(100):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.tensor(x)), torch.tensor(y)).backward()
            optimizer.step()
        np.savez({str(run_dir / "model.npz")!r}, **{{k: v.detach().numpy() for k, v in model.state_dict().items()}})
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_evaluate_shows_its_accuracy_in_the_task_body(dagbag: Any, tmp_path: Path) -> None:
    """The accuracy line comes before the "Post Execute" group the log page folds away."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.log.log_reader import TaskLogReader
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    dag = dagbag.get_dag("mpi_training_pipeline")
    dag_run = dag.test(mark_success_pattern=".*")  # the run and its task instances; nothing runs
    _trained_model(tmp_path)
    for task_id, value in (("preprocess", str(tmp_path)), ("train", {"result": {"test_accuracy": 0.95}})):
        XComModel.set("return_value", value, serialize=False, dag_id=dag.dag_id, task_id=task_id, run_id=dag_run.run_id)

    def evaluate_ti(session: Any) -> Any:
        query = select(TaskInstance).where(TaskInstance.run_id == dag_run.run_id, TaskInstance.task_id == "evaluate")
        return session.scalar(query)

    with create_session() as session:
        evaluate_ti(session).state = TaskInstanceState.QUEUED
    done = subprocess.run(
        [sys.executable, "-m", "tests.run_task", dag.dag_id, dag_run.run_id, "evaluate"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with create_session() as session:
        ti = evaluate_ti(session)
        assert ti.state == TaskInstanceState.SUCCESS
        logs, _ = TaskLogReader().read_log_chunks(ti, ti.try_number, {})
        records = [(str(getattr(m, "event", "")), getattr(m, "logger", None)) for m in logs]
    events = [event for event, _ in records]
    accuracy = [i for i, event in enumerate(events) if event.startswith("test accuracy ")]
    assert len(accuracy) == 1, events
    assert accuracy[0] < events.index("::group::Post Execute"), events
    assert events[accuracy[0]].endswith("(training reported 0.95)")
    # A log record of the task, stamped when the task wrote it. A printed line ("task.stdout") is
    # stamped when the supervisor gets round to reading it, which races the task's own end: the
    # log page then files the line under the folded "Post Execute" group (as a user saw it).
    assert records[accuracy[0]][1] != "task.stdout", records[accuracy[0]]


def test_unpausing_the_example_starts_no_run_at_once(dagbag: Any) -> None:
    """What the scheduler creates when the DAG is unpaused (its first automated run, computed by
    Airflow from the serialized DAG): a run at the next weekly time, not one at once beside the
    manual run the trigger dialog starts."""
    from airflow.sdk import timezone
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagSerialization.from_dict(DagSerialization.to_dict(dagbag.get_dag("mpi_training_pipeline")))
    first = dag.next_dagrun_info(last_automated_run_info=None)
    # Whatever the day: on a Sunday morning a plain "@weekly" gave that Sunday's 00:00, at once.
    now = timezone.utcnow()
    assert first is not None and now < first.run_after <= now + datetime.timedelta(days=7), first
    assert first.run_after.weekday() == 6 and (first.run_after.hour, first.run_after.minute) == (0, 0), first
