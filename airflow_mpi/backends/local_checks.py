"""What the local backend refuses before it creates anything: a machine that cannot run it, a
spec it cannot run, and a job of the same name that is not this task's to replace.

Every check here reads the machine (users, tools, paths) or a record, and changes nothing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path
from typing import Any

from airflow_mpi.backends.sandbox_state import DEFAULT_STATE_DIR, MAX_PODS
from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.job.naming import build_run_key
from airflow_mpi.job.plan import JobPlan

PRIVATE_ROOTS = ("/tmp",)  # every local pod mounts its own empty tmpfs here
REQUIRED_TOOLS = ("ip", "unshare", "setpriv", "mount", "nsenter", "ssh", "mpiexec", "bash")
SSHD = "/usr/sbin/sshd"


def check_prerequisites(path: str | None = None, state_dir: Path | None = None) -> list[str]:
    """What this machine lacks to run the local backend (empty when it can).

    ``path`` is the PATH pods get (its first entry is the interpreter's directory) and
    ``state_dir`` where job files live: neither may be under /tmp, which every pod gets as an
    empty private tmpfs, so the ranks would not find Python or the launch script.
    """
    problems = []
    python_dir = (path or os.path.dirname(sys.executable)).split(os.pathsep)[0]
    if _under(python_dir, PRIVATE_ROOTS):
        problems.append(
            f"a Python outside /tmp: this one ({python_dir}) is under /tmp, which every local pod gets as an"
            " empty private tmpfs, so ranks cannot run it; install the virtualenv elsewhere (e.g. /var/tmp, /opt)"
        )
    if state_dir is not None and _under(str(state_dir), PRIVATE_ROOTS):
        problems.append(
            f"a state_dir outside /tmp: {state_dir} is hidden inside every local pod (private /tmp);"
            f" leave state_dir unset ({DEFAULT_STATE_DIR}) or pick a directory only root can change, e.g."
            " /var/lib/airflow-mpi (created root's with mode 0700 when absent)"
        )
    if os.geteuid() != 0:
        problems.append("root (network, PID and mount namespaces need it): run as root")
    for tool in REQUIRED_TOOLS:
        if shutil.which(tool) is None:
            package = {"ip": "iproute2", "ssh": "openssh-client", "mpiexec": "openmpi-bin"}.get(tool, "util-linux")
            problems.append(f"'{tool}' (apt-get install {package})")
    if not Path(SSHD).exists():
        problems.append(f"{SSHD} (apt-get install openssh-server)")
    return problems


def check_supported(plan: JobPlan) -> None:
    """What this backend cannot run of a valid spec, every problem with its fix, as a ``SpecError``."""
    issues = []
    if len(plan.pods) > MAX_PODS:
        issues.append(
            SpecIssue(
                "workers.replicas",
                f"{len(plan.pods)} pods exceed the local backend's {MAX_PODS}",
                "use fewer",
            )
        )
    for index, volume in enumerate(plan.spec.pod.volumes):
        path = f"pod.volumes[{index}]"
        if not (volume.host_path or volume.empty_dir):
            issues.append(
                SpecIssue(path, f"{volume.sources[0]} volumes need Kubernetes", "use host_path or empty_dir locally")
            )
        elif volume.host_path and not (Path(volume.host_path) / (volume.sub_path or "")).exists():
            issues.append(SpecIssue(f"{path}.host_path", f"{volume.host_path} does not exist here", "create it"))
        if volume.host_path and _under(volume.host_path, (*PRIVATE_ROOTS, plan.paths.runtime_dir, "/run/sshd")):
            issues.append(
                SpecIssue(
                    f"{path}.host_path",
                    "is under /tmp or /run/sshd, which every local pod gets privately",
                    "share data from another directory, e.g. /var/tmp/...",
                )
            )
    for index, argument in enumerate(plan.spec.command):
        if argument.startswith("/") and _under(argument, PRIVATE_ROOTS) and Path(argument).exists():
            issues.append(
                SpecIssue(
                    f"command[{index}]",
                    f"{argument} is under /tmp, which every local pod gets as an empty private tmpfs",
                    "move the file elsewhere, e.g. /var/tmp/...",
                )
            )
    issues += check_run_as(plan)
    if issues:
        raise SpecError(issues)


def check_run_as(plan: JobPlan) -> list[SpecIssue]:
    """The pods run this machine's files: a non-root uid needs a user here, as it needs one in an
    image (ssh and sshd need its name, home and shell)."""
    run_as = plan.spec.pod.run_as
    if run_as is None:
        return []
    uid = run_as[0]
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return [
            SpecIssue(
                "pod.run_as_user",
                f"uid {uid} has no user on this machine, and the local backend runs the pods here: ssh and sshd "
                "need a user name, home and shell for it",
                f"create one: useradd --uid {uid} --create-home --shell /bin/bash mpiuser",
            )
        ]
    if user.pw_shell.endswith(("/nologin", "/false")):
        return [
            SpecIssue(
                "pod.run_as_user",
                f"the user {user.pw_name} (uid {uid}) has the shell {user.pw_shell}, so every command mpiexec "
                "starts over ssh would be refused",
                f"give it a shell: usermod --shell /bin/bash {user.pw_name}",
            )
        ]
    return []


def _under(path: str, roots: tuple[str, ...]) -> bool:
    clean = os.path.normpath(path)
    return any(clean == root or clean.startswith(root.rstrip("/") + "/") for root in roots)


def build_owner(plan: JobPlan) -> dict[str, Any]:
    """Who a local job belongs to, as its record keeps it: the task-instance try and its run key."""
    identity = plan.identity
    return {
        "dag_id": identity.dag_id,
        "task_id": identity.task_id,
        "run_id": identity.run_id,
        "map_index": identity.map_index,
        "try_number": identity.try_number,
        "run_key": build_run_key(identity),
    }


def describe_owner(owner: Any) -> str:
    if not isinstance(owner, dict) or "dag_id" not in owner:
        return "a task this record does not name"
    mapped = f", map index {owner.get('map_index')}" if owner.get("map_index", -1) != -1 else ""
    return (
        f"DAG {owner.get('dag_id')!r}, task {owner.get('task_id')!r}, run {owner.get('run_id')!r}, "
        f"try {owner.get('try_number')}{mapped}"
    )


def collision_problem(plan: JobPlan, state_dir: Path, theirs: Any, owner_pid: int, owner_alive: bool) -> str | None:
    """Why a recorded local job named like ``plan``'s may not be replaced by it (None when it may:
    an earlier attempt of this very task instance whose owner process is gone). A job whose owner
    runs, or whose run key is another task instance's, is never this task's to destroy or adopt."""
    ours = build_owner(plan)
    if not owner_alive and isinstance(theirs, dict) and theirs.get("run_key") == ours["run_key"]:
        return None
    if owner_alive:
        why, fix = (
            f"its owner, process {owner_pid}, is still running",
            "wait until that task ends (its job goes with it) or stop it, then run this one again",
        )
    else:
        why, fix = (
            f"its owner, process {owner_pid}, has ended, but it belongs to another task instance",
            f"`airflow-mpi doctor --clean --state-dir {state_dir}` removes it (its owner is gone)",
        )
    return (
        f"local job {plan.job_name} already exists in {state_dir} and is not this task's to replace: {why}. "
        f"It belongs to {describe_owner(theirs)}; this task is {describe_owner(ours)}. Nothing was created or "
        f"removed; {fix}"
    )
