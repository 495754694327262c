"""`airflow-mpi doctor --image` against the API double: one pod runs the checks (scripted output),
every failure is explained, and the pod is gone afterwards whatever happened."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_mpi.cli.main import main
from airflow_mpi.doctor import run as doctor
from airflow_mpi.doctor.checks import CHECKS
from tests.api_checks import object_problems
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.faults import FaultRow
from tests.k8s.conftest import Scripts

pytestmark = pytest.mark.usefixtures("connections")

IMAGE = "registry.example/train:1"


@pytest.fixture(autouse=True)
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "POLL_INTERVAL", 0.05)


def check_lines(**failures: str) -> list[str]:
    lines = []
    for check in CHECKS:
        detail = failures.get(check.name.replace("-", "_"))
        lines.append(f"airflow-mpi doctor: {check.name}: {'FAIL' if detail else 'ok'}: {detail or 'fine'}")
    return lines


def run_doctor(*extra: str) -> int:
    return main(["doctor", "--image", IMAGE, "--kubernetes-conn-id", "kube_double", "--namespace", "default", *extra])


def doctor_pods(double: KubeDouble) -> list[str]:
    return [p["metadata"]["name"] for p in double.list_objects("pods", "default")]


def test_an_image_that_passes_every_check(
    double: KubeDouble, scripts: Scripts, capsys: pytest.CaptureFixture[str]
) -> None:
    scripts.on("airflow-mpi-doctor-", PodScript(lines=lambda: iter(check_lines()), exit_code=0))
    assert run_doctor() == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"checks on image {IMAGE}:"
    assert out.count("  ok    ") == len(CHECKS) and "every check passed" in out
    [created] = [b for b in double.created if b.get("kind") == "Pod"]
    assert object_problems(created) == []
    assert created["spec"]["containers"][0]["image"] == IMAGE
    assert doctor_pods(double) == []


def test_the_jobs_mpi_and_launcher_reach_the_checks_in_the_pod(
    double: KubeDouble, scripts: Scripts, capsys: pytest.CaptureFixture[str]
) -> None:
    scripts.on("airflow-mpi-doctor-", PodScript(lines=lambda: iter(check_lines()), exit_code=0))
    assert run_doctor("--mpi", "intel", "--mpiexec", "/opt/intel/mpi/bin/mpiexec") == 0
    [created] = [b for b in double.created if b.get("kind") == "Pod"]
    env = {e["name"]: e["value"] for e in created["spec"]["containers"][0]["env"]}
    assert (env["AIRFLOW_MPI_DOCTOR_MPI"], env["AIRFLOW_MPI_DOCTOR_MPIEXEC"]) == ("intel", "/opt/intel/mpi/bin/mpiexec")
    with pytest.raises(SystemExit):  # refused before anything is created
        run_doctor("--mpi", "mvapich")
    with pytest.raises(SystemExit):
        run_doctor("--mpiexec", "mpiexec; rm -rf /")
    assert "is not a command name or an absolute path" in capsys.readouterr().err
    assert len([b for b in double.created if b.get("kind") == "Pod"]) == 1 and doctor_pods(double) == []


@pytest.mark.fault
def test_an_image_without_orted_on_the_ssh_path_is_explained(
    double: KubeDouble, scripts: Scripts, capsys: pytest.CaptureFixture[str], fault_row: FaultRow
) -> None:
    lines = check_lines(
        mpi_daemon_over_ssh="bash: line 1: orted: command not found",
        mpi="/usr/bin/mpiexec is mpich 4.0.2 but the job's MPI is openmpi",
    )
    scripts.on("airflow-mpi-doctor-", PodScript(lines=lambda: iter(lines), exit_code=1))
    started = time.monotonic()
    assert run_doctor() == 1
    seconds = time.monotonic() - started
    out = capsys.readouterr().out
    cause = next(line.strip() for line in out.splitlines() if line.strip().startswith("cause:"))
    fault_row("orted not on PATH over ssh (doctor)", "kubernetes", "cli", "failed", seconds, cause, doctor_pods(double))
    assert "  FAIL  mpi-daemon-over-ssh: bash: line 1: orted: command not found" in out
    assert "cause: the MPI's daemon is not found in a worker's ssh session" in out
    assert "fix: install the same MPI, at the same path" in out and "fix: install the job's MPI in the image" in out
    assert out.splitlines()[-1] == "2 check(s) failed"
    assert doctor_pods(double) == []


def test_a_pod_that_runs_no_check_says_why(
    double: KubeDouble, scripts: Scripts, capsys: pytest.CaptureFixture[str]
) -> None:
    scripts.on("airflow-mpi-doctor-", PodScript(lines=lambda: iter(['exec: "bash": not found']), exit_code=127))
    assert run_doctor() == 1
    out = capsys.readouterr().out
    assert out.count("no result: the checks stopped before this one") == len(CHECKS)
    assert "the pod ended before any check ran: Error, exit code 127" in out
    assert doctor_pods(double) == []


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        ({"fail": {"method": "POST", "path": "/pods", "status": 403}}, "refused 'create' on pods in namespace default (403)"),
        ({"script": PodScript(image_error="ErrImagePull")}, "the doctor pod cannot start: ErrImagePull"),
    ],
    ids=["rbac", "image"],
)  # fmt: skip
def test_errors_are_messages_and_leave_no_pod(
    setup: dict[str, Any], words: str, double: KubeDouble, scripts: Scripts, capsys: pytest.CaptureFixture[str]
) -> None:
    if "fail" in setup:
        double.fail_requests(**setup["fail"])
    else:
        scripts.on("airflow-mpi-doctor-", setup["script"])
    assert run_doctor() == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert doctor_pods(double) == []
