"""The rules of running a job without root (``pod.run_as_user``/``pod.run_as_group``).

A non-root job runs sshd and every rank as one uid, with no capabilities: uid 0 would defeat the
option, and sshd cannot listen on a port below 1024 without a capability. docs/contract.md#jobs-without-root
explains the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_mpi.exceptions import SpecIssue

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec

MAX_ID = 2_147_483_647  # the largest runAsUser/runAsGroup/fsGroup the API server accepts
FIRST_UNPRIVILEGED_PORT = 1024
SUGGESTED_UID = 1000  # the user docker/Dockerfile creates
SUGGESTED_PORT = 2222


def check_run_as(spec: MPIJobSpec) -> list[SpecIssue]:
    pod = spec.pod
    user, group = pod.run_as_user, pod.run_as_group
    issues = []
    if user is not None:
        if user == 0:
            issues.append(
                SpecIssue(
                    "pod.run_as_user",
                    "is 0, which is root, but this option is for running the job without root",
                    f"leave it out to run as the image's user (root), or use a non-root uid such as {SUGGESTED_UID}",
                )
            )
        elif not 0 < user <= MAX_ID:
            issues.append(
                SpecIssue(
                    "pod.run_as_user", f"is {user}", f"use a non-root uid from 1 to {MAX_ID}, e.g. {SUGGESTED_UID}"
                )
            )
    if group is not None:
        if user is None:
            issues.append(
                SpecIssue(
                    "pod.run_as_group",
                    "is set without pod.run_as_user; the group applies only to a job that runs without root",
                    f"set pod.run_as_user too (e.g. {SUGGESTED_UID}), or remove pod.run_as_group",
                )
            )
        if not 0 <= group <= MAX_ID:
            issues.append(SpecIssue("pod.run_as_group", f"is {group}", f"use a gid from 0 to {MAX_ID}"))
    if user is not None and user != 0 and spec.ssh_port < FIRST_UNPRIVILEGED_PORT:
        issues.append(
            SpecIssue(
                "ssh_port",
                f"is {spec.ssh_port}, a privileged port (below {FIRST_UNPRIVILEGED_PORT}); sshd running as uid "
                f"{user} keeps no capabilities and cannot listen on it",
                f"set ssh_port to an unprivileged port, e.g. {SUGGESTED_PORT}",
            )
        )
    return issues
