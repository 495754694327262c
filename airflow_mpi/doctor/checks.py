"""``airflow-mpi doctor``, the pure part: the checks, the pod that runs them in an image, and
what each failure means.

The checks themselves are ``scripts/doctor.sh`` after the launch script's functions (bash, in the
image or on this machine): the same sshd options and the same ssh probe as a job. It prints one line per check
(``airflow-mpi doctor: <check>: ok|FAIL|skip: <detail>``); ``parse_doctor_output`` reads them,
and every FAIL is explained with ``diagnosis`` (the cause a failing job would show) or, for a
check no job failure corresponds to, the check's own fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from airflow_mpi.contract import ENV_RUNTIME_DIR, PodPaths
from airflow_mpi.job.ssh import render_ssh_config, render_sshd_config
from airflow_mpi.observe.diagnosis import Cause, Diagnosis, diagnose
from airflow_mpi.spec.types import MPIOptions

LINE = re.compile(r"^airflow-mpi doctor: (?P<check>[a-z0-9-]+): (?P<status>ok|FAIL|skip): (?P<detail>.*)$")
ENV_DOCTOR_PORT = "AIRFLOW_MPI_DOCTOR_PORT"
ENV_DOCTOR_SSHD_CONFIG = "AIRFLOW_MPI_DOCTOR_SSHD_CONFIG"
ENV_DOCTOR_SSH_CONFIG = "AIRFLOW_MPI_DOCTOR_SSH_CONFIG"
ENV_DOCTOR_MPI = "AIRFLOW_MPI_DOCTOR_MPI"
ENV_DOCTOR_MPIEXEC = "AIRFLOW_MPI_DOCTOR_MPIEXEC"
DOCTOR_PORT = 2222  # in the doctor pod; locally a free port is chosen
DOCTOR_RUNTIME_DIR = "/run/airflow-mpi-doctor"  # in the doctor pod; locally one per run
CONTAINER = "doctor"
# A job's MPI and launcher when its spec names none (mpi.implementation, mpi.mpiexec).
DEFAULT_MPI, DEFAULT_MPIEXEC = MPIOptions.implementation, MPIOptions.mpiexec


class Status(str, Enum):
    OK = "ok"
    FAIL = "FAIL"
    SKIP = "skip"


@dataclass(frozen=True)
class Check:
    name: str
    what: str  # what passing means
    cause: Cause | None  # the job failure this check foresees
    fix: str = ""  # for a check no diagnosis covers


# In the order doctor.sh's run_doctor prints them (tests/unit/test_preflight.py compares).
CHECKS: tuple[Check, ...] = (
    Check("mpiexec", "mpiexec is on the PATH", Cause.NO_MPIEXEC),
    Check(
        "mpi",
        "the launcher is the job's MPI (mpi.implementation): Open MPI 4.x or 5.x, MPICH or Intel MPI",
        None,
        "install the job's MPI in the image (Debian/Ubuntu: apt-get install openmpi-bin, or mpich), or give "
        "doctor the job's --mpi and --mpiexec (the spec's mpi.implementation and mpi.mpiexec)",
    ),
    Check(
        "mpiexec-as-root",
        "mpiexec starts a process as root with --allow-run-as-root",
        None,
        "mpiexec's own message above says why it cannot start a process in this image",
    ),
    Check(
        "mpi-daemon",
        "the daemon the launcher starts on every host is there (Open MPI 4: orted, 5: prted, on the PATH; "
        "MPICH and Intel MPI: hydra_pmi_proxy beside the launcher)",
        Cause.ORTED_NOT_FOUND,
    ),
    Check("ssh", "the OpenSSH client is on the PATH", None, "install it (apt-get install openssh-client)"),
    Check("sshd", "/usr/sbin/sshd exists", Cause.NO_SSHD),
    Check("run-sshd", "/run/sshd exists or can be created", Cause.SSHD_PRIVSEP_DIR),
    Check(
        "sshd-config",
        "sshd accepts the job's sshd_config (sshd -t)",
        None,
        "use an OpenSSH server of version 7.8 or later (the job's sshd_config uses its options); sshd's own "
        "message above names the line it refuses",
    ),
    Check(
        "ssh-login",
        "sshd accepts the job key over ssh (StrictModes, file modes)",
        None,
        "sshd's own log lines above say why it refused the login or stopped",
    ),
    Check(
        "mpi-daemon-over-ssh",
        "a non-interactive ssh session finds that daemon, as the launcher starts it",
        Cause.ORTED_NOT_FOUND,
    ),
)
BY_NAME = {check.name: check for check in CHECKS}


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: Status
    detail: str

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL


def parse_doctor_output(lines: Iterable[str]) -> list[CheckResult]:
    """One result per known check, in ``CHECKS`` order; a check that printed nothing failed (the
    script stopped before it, e.g. an image without bash)."""
    found: dict[str, CheckResult] = {}
    for line in lines:
        match = LINE.match(line.strip())
        if match and match["check"] in BY_NAME:
            found.setdefault(match["check"], CheckResult(match["check"], Status(match["status"]), match["detail"]))
    return [
        found.get(check.name) or CheckResult(check.name, Status.FAIL, "no result: the checks stopped before this one")
        for check in CHECKS
    ]


def explain_result(result: CheckResult) -> Diagnosis | None:
    """The job failure a failed check foresees (None: the check's own fix applies)."""
    if not result.failed:
        return None
    found = diagnose([result.detail])
    if found:
        return found[0]
    check = BY_NAME[result.check]
    return Diagnosis(check.cause, result.detail) if check.cause is not None else None


def render_doctor_report(results: Sequence[CheckResult], title: str) -> list[str]:
    """Lines for the terminal: a line per check, each failure followed by its cause and fix."""
    lines = [title]
    for result in results:
        check = BY_NAME.get(result.check)
        lines.append(f"  {result.status.value:<4}  {result.check}: {result.detail}")
        if not result.failed:
            continue
        diagnosis = explain_result(result)
        if diagnosis is not None:
            lines += [f"        cause: {diagnosis.summary}", f"        fix: {diagnosis.fix} ({diagnosis.doc})"]
        elif check is not None:
            lines += [f"        needed: {check.what}", f"        fix: {check.fix}"]
    failed = sum(r.failed for r in results)
    lines.append(f"{failed} check(s) failed" if failed else "every check passed")
    return lines


def build_doctor_env(
    runtime_dir: str, port: int, mpi: str = DEFAULT_MPI, mpiexec: str = DEFAULT_MPIEXEC
) -> dict[str, str]:
    """What ``doctor.sh`` reads: a scratch runtime directory, the port of its sshd, the job's MPI
    and launcher (``mpi.implementation``, ``mpi.mpiexec``), and the job's sshd_config and
    ssh_config rendered for that directory and port."""
    paths = PodPaths(runtime_dir=runtime_dir)
    return {
        ENV_RUNTIME_DIR: runtime_dir,
        ENV_DOCTOR_PORT: str(port),
        ENV_DOCTOR_MPI: mpi,
        ENV_DOCTOR_MPIEXEC: mpiexec,
        ENV_DOCTOR_SSHD_CONFIG: render_sshd_config(port, paths),
        ENV_DOCTOR_SSH_CONFIG: render_ssh_config(port, paths),
    }


def render_doctor_pod(
    name: str, namespace: str, image: str, script: str, *, deadline_seconds: int = 300, mpi: str = DEFAULT_MPI,
    mpiexec: str = DEFAULT_MPIEXEC,
) -> dict[str, Any]:  # fmt: skip
    """A pod that runs the doctor's ``script`` in ``image`` once, as a job's pods would run (root,
    bash, the image's PATH), and ends; its log holds the check lines."""
    env = build_doctor_env(DOCTOR_RUNTIME_DIR, DOCTOR_PORT, mpi, mpiexec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "airflow-mpi",
                "app.kubernetes.io/component": "doctor",
                "app.kubernetes.io/managed-by": "airflow-mpi",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": deadline_seconds,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "command": ["bash", "-c", script, "doctor"],
                    "env": [{"name": key, "value": value} for key, value in sorted(env.items())],
                    "volumeMounts": [{"name": "doctor-runtime", "mountPath": DOCTOR_RUNTIME_DIR}],
                }
            ],
            # As a job pod's /run/airflow-mpi: a memory emptyDir, whose modes the checks then meet.
            "volumes": [{"name": "doctor-runtime", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}],
        },
    }


def describe_pod_end(pod: Mapping[str, Any]) -> str:
    """Why a doctor pod ended without check lines (no bash, an image that cannot be pulled ...)."""
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    state = (containers[0].get("state") or {}) if containers else {}
    for key in ("terminated", "waiting"):
        if key in state:
            detail = state[key]
            parts = [str(detail.get("reason") or key), str(detail.get("message") or "")]
            if "exitCode" in detail:
                parts.append(f"exit code {detail['exitCode']}")
            return ", ".join(part for part in parts if part)
    return str(status.get("message") or status.get("reason") or status.get("phase") or "unknown")
