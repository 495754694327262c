"""The example's checkpoints, for real (DeepSpeed ZeRO-2 on 3 CPU ranks, the local backend): each
epoch is marked complete only after every rank saved it; a resume takes the newest complete one
and, when the newest is torn (a file cut short, a save that never finished), falls back to the
one before and says why in the log."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.runner.job import JobRunner
from tests.integration.test_local_backend import Log, make_plan

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "dags" / "scripts" / "train_digits.py"


def prepare(data: Path) -> None:
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    np.savez(data / "train.npz", x=x[:1200], y=digits.target[:1200])
    np.savez(data / "test.npz", x=x[1200:], y=digits.target[1200:])


def train(backend: LocalBackend, data: Path, epochs: int) -> tuple[dict[str, Any], Log]:
    command = [sys.executable, str(SCRIPT), "--data", str(data), "--epochs", str(epochs), "--keep-checkpoints", "3"]
    plan = make_plan(command, env={"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}, mpi={"btl": "tcp,self"},
                     timeout=600)  # fmt: skip
    log = Log()
    result = JobRunner(backend, plan, log).run()
    return result.result, log


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
        ({}, ((0, 0), [])),
        ({"epoch1/COMPLETE.json": '{"world_size": 2, "files": {"a.pt": 3}}', "epoch1/a.pt": "abc"}, ((1, 2), [])),
        (
            {"epoch1/COMPLETE.json": '{"world_size": 2, "files": {"a.pt": 3}}', "epoch1/a.pt": "abc",
             "epoch2/COMPLETE.json": "{not json", "epoch2/a.pt": "abc"},
            ((1, 2), ["epoch 2 is torn: its completion marker is unreadable"]),
        ),
        (
            {"epoch3/COMPLETE.json": '{"world_size": 2, "files": {"a.pt": 3, "b.pt": 1}}', "epoch3/a.pt": "abc"},
            ((0, 0), ["epoch 3 is torn: b.pt is missing"]),
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
