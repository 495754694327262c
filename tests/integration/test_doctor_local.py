"""`airflow-mpi doctor --local` for real: the checks pass on this machine, a PATH without orted
fails the two orted checks with the cause a job would show, and nothing is left running."""

from __future__ import annotations

import glob
import subprocess
import sys
import time
from pathlib import Path

from airflow_mpi.doctor.checks import CHECKS, Status, explain_result
from airflow_mpi.doctor.run import run_local_doctor
from airflow_mpi.observe.diagnosis import Cause
from tests.integration.test_diagnosis_local import path_without
from tests.leaks import ours


def test_this_machine_passes_every_check_and_nothing_is_left() -> None:
    started = time.monotonic()
    report = run_local_doctor()
    assert report.ok, "\n".join(report.output)
    assert [r.check for r in report.results] == [c.name for c in CHECKS]
    assert all(r.status is Status.OK for r in report.results)
    assert time.monotonic() - started < 30
    assert glob.glob("/run/airflow-mpi-doctor-*") == [] and ours() == []


def test_a_path_without_orted_fails_both_orted_checks_with_the_cause(shared_dir: Path) -> None:
    report = run_local_doctor(path=path_without(shared_dir, {"orted"}))
    failed = {r.check: r for r in report.results if r.failed}
    assert set(failed) == {"orted", "orted-over-ssh"}, "\n".join(report.output)
    assert "orted: command not found" in failed["orted-over-ssh"].detail  # a real non-interactive ssh session
    for result in failed.values():
        diagnosis = explain_result(result)
        assert diagnosis is not None and diagnosis.cause is Cause.ORTED_NOT_FOUND
    assert glob.glob("/run/airflow-mpi-doctor-*") == [] and ours() == []


def test_the_cli_prints_the_report_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "airflow_mpi.cli.main", "doctor", "--local"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checks on this machine:" in done.stdout and "every check passed" in done.stdout
    assert ours() == []
