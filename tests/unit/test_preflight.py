"""airflow-mpi doctor's pure part: the checks launch.sh runs are preflight's, in order; every
failure is explained with a cause or a fix; the doctor pod is a valid, minimal Kubernetes pod."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest

from airflow_mpi.contract import ENV_RUNTIME_DIR
from airflow_mpi.doctor.checks import (
    CHECKS,
    ENV_DOCTOR_MPI,
    ENV_DOCTOR_MPIEXEC,
    ENV_DOCTOR_SSH_CONFIG,
    ENV_DOCTOR_SSHD_CONFIG,
    CheckResult,
    Status,
    build_doctor_env,
    describe_pod_end,
    explain_result,
    parse_doctor_output,
    render_doctor_pod,
    render_doctor_report,
)
from airflow_mpi.observe.diagnosis import Cause
from airflow_mpi.scripts import doctor_script_text
from tests.api_checks import api_server_refusals

SCRIPT = doctor_script_text()


def test_launch_sh_runs_exactly_the_checks_in_order() -> None:
    names = re.findall(r'doctor_line "?([a-z0-9-]+)"? (?:ok|FAIL|skip)', SCRIPT)
    first_seen = list(dict.fromkeys(names))
    assert first_seen == [check.name for check in CHECKS]
    looped = re.search(r"for i in ([a-z0-9 -]+); do\n\s+doctor_line \"\$i\" skip", SCRIPT)
    assert looped and looped.group(1).split() == ["sshd-config", "ssh-login", "mpi-daemon-over-ssh"]


def output(**failures: str) -> list[str]:
    lines = ["some unrelated line"]
    for check in CHECKS:
        detail = failures.get(check.name.replace("-", "_"))
        lines.append(f"airflow-mpi doctor: {check.name}: {'FAIL' if detail else 'ok'}: {detail or 'fine'}")
    return lines


def test_parse_reads_one_result_per_check() -> None:
    results = parse_doctor_output(output(mpi_daemon_over_ssh="bash: line 1: orted: command not found"))
    assert [r.check for r in results] == [c.name for c in CHECKS]
    failed = [r for r in results if r.failed]
    assert failed == [CheckResult("mpi-daemon-over-ssh", Status.FAIL, "bash: line 1: orted: command not found")]


def test_a_check_that_printed_nothing_failed() -> None:
    results = parse_doctor_output(["airflow-mpi doctor: mpiexec: ok: /usr/bin/mpiexec"])
    assert results[0].status is Status.OK
    assert all(r.failed and "no result" in r.detail for r in results[1:])


@pytest.mark.parametrize(
    ("check", "detail", "cause"),
    [
        ("mpiexec", "mpiexec: not found on PATH=/usr/bin", Cause.NO_MPIEXEC),
        ("mpi-daemon", "orted: not found on PATH=/usr/bin", Cause.ORTED_NOT_FOUND),
        ("mpi-daemon-over-ssh", "bash: line 1: orted: command not found", Cause.ORTED_NOT_FOUND),
        ("mpi-daemon-over-ssh", "prted: command not found (PATH=/usr/bin:/bin)", Cause.ORTED_NOT_FOUND),
        ("mpi-daemon", "/opt/mpich/bin/hydra_pmi_proxy: No such file or directory", Cause.ORTED_NOT_FOUND),
        ("sshd", "/usr/sbin/sshd: No such file or directory", Cause.NO_SSHD),
        ("run-sshd", "Missing privilege separation directory: /run/sshd cannot be created: ro", Cause.SSHD_PRIVSEP_DIR),
        ("mpiexec-as-root", "mpiexec has detected an attempt to run as root.", Cause.MPIRUN_AS_ROOT),
        (
            "ssh-login",
            "key refused: ... Authentication refused: bad ownership or modes for file /x/authorized_keys",
            Cause.SSHD_BAD_MODES,
        ),
        ("ssh-login", "port closed: nothing listens on port 2222: sshd is not running", Cause.SSHD_NOT_LISTENING),
    ],
)
def test_a_failed_check_is_explained_by_the_job_failure_it_foresees(check: str, detail: str, cause: Cause) -> None:
    diagnosis = explain_result(CheckResult(check, Status.FAIL, detail))
    assert diagnosis is not None and diagnosis.cause is cause


def test_every_check_has_a_cause_or_its_own_fix() -> None:
    for check in CHECKS:
        assert check.what and (check.cause is not None or check.fix), check.name
        if check.cause is None:
            assert explain_result(CheckResult(check.name, Status.FAIL, "something odd")) is None


def test_report_lines_give_cause_and_fix_under_each_failure() -> None:
    results = parse_doctor_output(
        output(
            mpi_daemon_over_ssh="bash: line 1: orted: command not found",
            mpi="/usr/bin/mpiexec is mpich 4.0.2 but the job's MPI is openmpi",
        )
    )
    lines = render_doctor_report(results, "checks on image x:")
    assert lines[0] == "checks on image x:" and lines[-1] == "2 check(s) failed"
    at = lines.index("  FAIL  mpi-daemon-over-ssh: bash: line 1: orted: command not found")
    assert lines[at + 1].startswith("        cause: the MPI's daemon is not found in a worker's ssh session")
    assert (
        lines[at + 2].startswith("        fix: install the same MPI, at the same path")
        and "#orted-command-not-found" in lines[at + 2]
    )
    at = lines.index("  FAIL  mpi: /usr/bin/mpiexec is mpich 4.0.2 but the job's MPI is openmpi")
    assert lines[at + 1].startswith("        needed: the launcher is the job's MPI")
    assert lines[at + 2].startswith("        fix: install the job's MPI in the image") and "--mpi" in lines[at + 2]
    assert render_doctor_report(parse_doctor_output(output()), "t")[-1] == "every check passed"


def test_doctor_env_renders_the_job_configs_for_the_scratch_directory() -> None:
    env = build_doctor_env("/run/airflow-mpi-doctor-x", 2345)
    assert env[ENV_RUNTIME_DIR] == "/run/airflow-mpi-doctor-x"
    assert (env[ENV_DOCTOR_MPI], env[ENV_DOCTOR_MPIEXEC]) == ("openmpi", "mpiexec")  # the spec's defaults
    hydra = build_doctor_env("/run/x", 2345, "mpich", "/opt/mpich/bin/mpiexec")
    assert (hydra[ENV_DOCTOR_MPI], hydra[ENV_DOCTOR_MPIEXEC]) == ("mpich", "/opt/mpich/bin/mpiexec")
    assert "Port 2345\n" in env[ENV_DOCTOR_SSHD_CONFIG]
    assert "AuthorizedKeysFile /run/airflow-mpi-doctor-x/ssh/authorized_keys\n" in env[ENV_DOCTOR_SSHD_CONFIG]
    assert "StrictModes yes\n" in env[ENV_DOCTOR_SSHD_CONFIG]
    assert "IdentityFile /run/airflow-mpi-doctor-x/ssh/id_ed25519\n" in env[ENV_DOCTOR_SSH_CONFIG]
    assert "StrictHostKeyChecking yes\n" in env[ENV_DOCTOR_SSH_CONFIG]


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_doctor_pod_is_a_valid_pod_that_runs_the_launch_script(version: str) -> None:
    pod = render_doctor_pod("airflow-mpi-doctor-1a2b", "ml", "registry.example/train:1", SCRIPT, deadline_seconds=120)
    kubernetes_validate.validate(pod, version, strict=True)
    assert api_server_refusals("pods", pod) == []
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["bash", "-c", SCRIPT, "doctor"]
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["activeDeadlineSeconds"] == 120
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert {e["name"] for e in container["env"]} >= {ENV_RUNTIME_DIR, ENV_DOCTOR_SSHD_CONFIG, ENV_DOCTOR_SSH_CONFIG}


def test_a_pod_that_never_ran_a_check_says_why() -> None:
    pod = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "reason": "StartError",
                            "message": 'exec: "bash": executable file not found in $PATH',
                            "exitCode": 128,
                        }
                    }
                }
            ],
        }
    }
    assert describe_pod_end(pod) == 'StartError, exec: "bash": executable file not found in $PATH, exit code 128'
