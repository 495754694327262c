"""`airflow connections test` of a local-backend ``mpi`` connection runs the doctor's checks for
real: it passes on this machine, names the failed checks when orted is missing, and leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_mpi.doctor.checks import CHECKS
from airflow_mpi.hooks.mpi import MPIJobHook
from tests.integration.test_diagnosis_local import path_without
from tests.leaks import ours


def test_the_local_backend_passes_the_doctors_checks() -> None:
    assert MPIJobHook("mpi_default").test_connection() == (
        True,
        f"local backend ready: {len(CHECKS)} checks passed on this machine",
    )
    assert ours() == []


def test_a_machine_without_orted_fails_naming_the_checks(shared_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", path_without(shared_dir, {"orted"}))
    ok, message = MPIJobHook("mpi_default").test_connection()
    assert not ok and message.startswith("local backend not ready: mpi-daemon: ")
    assert "mpi-daemon-over-ssh: " in message and "orted: command not found" in message
    assert ours() == []
