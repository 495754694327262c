"""The example's checkpoints, for real (DeepSpeed ZeRO-2 on 3 CPU ranks, the local backend): each
epoch is marked complete only after every rank saved it; a resume takes the newest complete one
and, when the newest is torn (a file cut short, a save that never finished), falls back to the
one before and says why in the log."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.runner.job import JobRunner
from tests.integration.test_local_backend import Log, make_plan
from tests.integration.test_notice_local import run_quietly

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "dags" / "scripts" / "train_digits.py"


def prepare(data: Path) -> None:
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    np.savez(data / "train.npz", x=x[:1200], y=digits.target[:1200])
    np.savez(data / "test.npz", x=x[1200:], y=digits.target[1200:])


def runner(backend: LocalBackend, data: Path, epochs: int, log: Log) -> JobRunner:
    command = [sys.executable, str(SCRIPT), "--data", str(data), "--epochs", str(epochs), "--keep-checkpoints", "3"]
    plan = make_plan(command, env={"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}, mpi={"btl": "tcp,self"},
                     timeout=600)  # fmt: skip
    return JobRunner(backend, plan, log)


STEPS_PER_EPOCH = 12  # prepare()'s 1200 samples over 3 ranks, 32 a step


def train(backend: LocalBackend, data: Path, epochs: int) -> tuple[dict[str, Any], Log]:
    log = Log()
    result = runner(backend, data, epochs, log).run()
    return result.result, log


def test_a_killed_task_saves_on_the_notice_and_its_retry_loses_no_step(backend: LocalBackend, shared_dir: Path) -> None:
    """Killed (as on_kill does) after epoch 2 of 30: the ranks save where they agree to stop,
    ``epoch<E>-step<S>``, and the retry goes on from that very step, to the model an unbroken run
    trains (the same test accuracy, every step trained once)."""
    prepare(shared_dir)
    log = Log()
    first = runner(backend, shared_dir, 30, log)
    thread = threading.Thread(target=run_quietly, args=(first,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while not any("epoch 2/30" in line for line in log.lines):
        assert time.monotonic() < deadline and thread.is_alive(), log.lines[-30:]
        time.sleep(0.05)
    assert first.teardown(notice=True) == []
    thread.join(30)
    saved = [p.name for p in (shared_dir / "checkpoints").glob("epoch*-step*") if (p / "COMPLETE.json").exists()]
    assert len(saved) == 1, (saved, log.lines[-30:])
    epoch, step = (int(n) for n in saved[0].removeprefix("epoch").split("-step"))
    assert epoch >= 2 and step == 10, saved  # the first step the ranks asked one another after the notice

    resumed, log = train(backend, shared_dir, epochs=30)
    assert (resumed["resumed_from_epoch"], resumed["resumed_from_step"]) == (epoch, step), resumed
    assert any(f"resumed from checkpoint epoch {epoch} step {step} (of 30)" in line for line in log.lines)
    assert resumed["trained_steps"] == 30 * STEPS_PER_EPOCH - (epoch * STEPS_PER_EPOCH + step), resumed

    unbroken_dir = shared_dir.with_name(f"{shared_dir.name}-unbroken")
    unbroken_dir.mkdir()
    try:
        prepare(unbroken_dir)
        unbroken, _ = train(backend, unbroken_dir, epochs=30)
    finally:
        shutil.rmtree(unbroken_dir, ignore_errors=True)
    assert resumed["test_accuracy"] == unbroken["test_accuracy"], (resumed, unbroken)


def test_a_torn_newest_checkpoint_is_passed_over_for_the_one_before_and_said(
    backend: LocalBackend, shared_dir: Path
) -> None:
    prepare(shared_dir)
    first, _ = train(backend, shared_dir, epochs=2)
    assert first["resumed_from_epoch"] == 0
    checkpoints = shared_dir / "checkpoints"
    marker = json.loads((checkpoints / "epoch2" / "COMPLETE.json").read_text())
    assert marker["world_size"] == 3 and len(marker["files"]) >= 4  # the model and each rank's shard
    # Tear epoch 2: one rank's optimizer shard cut short, as a save killed mid-write leaves it.
    shard = sorted((checkpoints / "epoch2").glob("*optim_states.pt"))[-1]
    shard.write_bytes(shard.read_bytes()[:100])

    second, log = train(backend, shared_dir, epochs=3)
    assert second["resumed_from_epoch"] == 1, second
    said = [line for line in log.lines if "resumed from checkpoint epoch 1 (of 3)" in line]
    assert said and f"epoch 2 is torn: {shard.name} is 100 bytes" in said[0], log.lines[-30:]
    assert second["epochs"] == 3

    # Its save never finished: no marker at all. The retrained epoch 3 is the newest complete one.
    (checkpoints / "epoch4").mkdir()
    (checkpoints / "epoch4" / "mp_rank_00_model_states.pt").write_bytes(b"partial")
    third, log = train(backend, shared_dir, epochs=4)
    assert third["resumed_from_epoch"] == 3, third
    said = [line for line in log.lines if "resumed from checkpoint epoch 3 (of 4)" in line]
    assert said and "epoch 4 is torn: no completion marker (its save did not finish)" in said[0], log.lines[-30:]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, ((0, 0, 0), [])),
        ({"epoch1/COMPLETE.json": '{"world_size": 2, "files": {"a.pt": 3}}', "epoch1/a.pt": "abc"}, ((1, 0, 2), [])),
        (
            {"epoch1/COMPLETE.json": '{"world_size": 2, "files": {"a.pt": 3}}', "epoch1/a.pt": "abc",
             "epoch2/COMPLETE.json": "{not json", "epoch2/a.pt": "abc"},
            ((1, 0, 2), ["epoch 2 is torn: its completion marker is unreadable"]),
        ),
        (
            {"epoch3/COMPLETE.json": '{"world_size": 2, "files": {"a.pt": 3, "b.pt": 1}}', "epoch3/a.pt": "abc"},
            ((0, 0, 0), ["epoch 3 is torn: b.pt is missing"]),
        ),
        (  # saved on the notice, 40 steps into epoch 2: newer than epoch 1, older than epoch 2
            {"epoch1/COMPLETE.json": '{"world_size": 2, "files": {}}',
             "epoch1-step40/COMPLETE.json": '{"world_size": 2, "files": {}}'},
            ((1, 40, 2), []),
        ),
        (
            {"epoch1-step40/COMPLETE.json": '{"world_size": 2, "files": {}}',
             "epoch2/COMPLETE.json": '{"world_size": 2, "files": {}}', "epoch2-step5/a.pt": "a"},
            ((2, 0, 2), ["epoch 2 step 5 is torn: no completion marker"]),
        ),
    ],
)  # fmt: skip
def test_which_checkpoint_a_resume_takes(tmp_path: Path, files: dict[str, str], expected: Any) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_digits", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    newest, passed = module.newest_complete(tmp_path)
    assert newest == expected[0]
    assert len(passed) == len(expected[1]) and all(p.startswith(e) for p, e in zip(passed, expected[1], strict=True))
