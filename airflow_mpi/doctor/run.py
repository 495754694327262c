"""``airflow-mpi doctor``: run the pre-job checks (``scripts/doctor.sh``) here or in an image.

``--local`` runs them on this machine with the environment local pods get; ``--image`` runs them
in one short pod of the image on Kubernetes, which is deleted afterwards whatever happens. What
the checks are and what their failures mean is ``preflight``'s.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from airflow_mpi.backends.k8s_errors import FORBIDDEN, NOT_FOUND, UNAUTHORIZED, api_status, describe
from airflow_mpi.backends.local import LocalBackend, check_prerequisites
from airflow_mpi.doctor.checks import (
    DEFAULT_MPI,
    DEFAULT_MPIEXEC,
    CheckResult,
    build_doctor_env,
    describe_pod_end,
    parse_doctor_output,
    render_doctor_pod,
)
from airflow_mpi.exceptions import BackendUnavailable
from airflow_mpi.observe.status import FATAL_WAITING_REASONS, pod_state_from_k8s
from airflow_mpi.scripts import doctor_script_text

LOCAL_TIMEOUT = 120.0
POLL_INTERVAL = 1.0
DELETE_TIMEOUT = 60.0


@dataclass
class DoctorReport:
    where: str  # "this machine" or "image <name>"
    results: list[CheckResult]
    missing: list[str] = field(default_factory=list)  # the local backend's prerequisites
    output: list[str] = field(default_factory=list)  # the check script's own lines

    @property
    def ok(self) -> bool:
        return not self.missing and not any(r.failed for r in self.results)


def run_local_doctor(
    path: str | None = None, timeout: float = LOCAL_TIMEOUT, mpi: str = DEFAULT_MPI, mpiexec: str = DEFAULT_MPIEXEC
) -> DoctorReport:
    """The checks on this machine, with the PATH local pods get (``path`` as ``LocalBackend``'s),
    for a job of MPI ``mpi`` started by ``mpiexec``."""
    runtime_dir = f"/run/airflow-mpi-doctor-{secrets.token_hex(4)}"
    pod_path = LocalBackend(path=path).path
    env = {
        "PATH": pod_path,
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        **build_doctor_env(runtime_dir, _free_port(), mpi, mpiexec),
    }
    proc = subprocess.Popen(
        ["bash", "-c", doctor_script_text(), "doctor"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its sshd is in this group: a timeout kills both
        cwd="/",
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\nairflow-mpi doctor: the checks did not finish within {timeout:.0f}s"
    finally:
        subprocess.run(["rm", "-rf", runtime_dir], check=False)
    lines = out.splitlines()
    return DoctorReport("this machine", parse_doctor_output(lines), check_prerequisites(pod_path), lines)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_image_doctor(
    core: Any,
    image: str,
    namespace: str,
    timeout: float = 300.0,
    mpi: str = DEFAULT_MPI,
    mpiexec: str = DEFAULT_MPIEXEC,
) -> DoctorReport:
    """The checks in one pod of ``image``: create it, wait until it ends, read its log, delete it."""
    name = f"airflow-mpi-doctor-{secrets.token_hex(4)}"
    limit = int(timeout)
    manifest = render_doctor_pod(
        name, namespace, image, doctor_script_text(), deadline_seconds=limit, mpi=mpi, mpiexec=mpiexec
    )
    _call("create", "pods", namespace, lambda: core.create_namespaced_pod(namespace, manifest))
    try:
        pod = _wait_until_ended(core, name, namespace, timeout)
        log = _call(
            "get",
            "pods/log",
            namespace,
            lambda: core.read_namespaced_pod_log(name, namespace, _preload_content=False).data,
        )
        lines = log.decode("utf-8", "replace").splitlines() if isinstance(log, bytes) else str(log).splitlines()
        results = parse_doctor_output(lines)
        if not any(line.startswith("airflow-mpi doctor: ") for line in lines):
            lines.append(f"airflow-mpi doctor: the pod ended before any check ran: {describe_pod_end(pod)}")
        return DoctorReport(f"image {image}", results, [], lines)
    finally:
        _delete(core, name, namespace)


def _delete(core: Any, name: str, namespace: str, timeout: float = DELETE_TIMEOUT) -> None:
    """Delete the pod and wait (bounded) until it is gone; a failure is reported, not raised over
    the report or the error that got here."""
    deadline = time.monotonic() + timeout
    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        while time.monotonic() < deadline:
            core.read_namespaced_pod(name, namespace, _preload_content=False)
            time.sleep(POLL_INTERVAL)
    except Exception as error:
        if api_status(error) == NOT_FOUND:
            return  # gone
        print(f"airflow-mpi: could not delete the doctor pod {namespace}/{name}: {error}", file=sys.stderr)
        return
    print(f"airflow-mpi: the doctor pod {namespace}/{name} was still there after {timeout:.0f}s", file=sys.stderr)


def _wait_until_ended(core: Any, name: str, namespace: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        raw = _call(
            "get", "pods", namespace, lambda: core.read_namespaced_pod(name, namespace, _preload_content=False).data
        )
        pod: dict[str, Any] = json.loads(raw)
        state = pod_state_from_k8s(pod)
        if state.ended:
            return pod
        if state.reason in FATAL_WAITING_REASONS:
            raise BackendUnavailable(f"the doctor pod cannot start: {state.reason}: {state.message}")
        if time.monotonic() >= deadline:
            raise BackendUnavailable(
                f"the doctor pod did not finish within {timeout:.0f}s: {describe_pod_end(pod)} "
                "(is the image large, or the namespace short of resources?)"
            )
        time.sleep(POLL_INTERVAL)


def _call(verb: str, resource: str, namespace: str, request: Any) -> Any:
    """One API request; a refusal becomes a message naming the verb and resource to allow."""
    try:
        return request()
    except Exception as error:
        status = api_status(error)
        if status in (UNAUTHORIZED, FORBIDDEN):
            raise BackendUnavailable(
                f"Kubernetes refused '{verb}' on {resource} in namespace {namespace} ({status}): the doctor needs "
                "create, get and delete on pods and get on pods/log (the Role in docs/guides/rbac.md grants them)"
            ) from error
        if status == NOT_FOUND and verb == "create":
            raise BackendUnavailable(f"namespace {namespace} does not exist: create it or pass --namespace") from error
        if status is not None:
            raise BackendUnavailable(f"Kubernetes answered {describe(error)} to '{verb}' on {resource}") from error
        raise
