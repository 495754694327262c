"""Running one command in every running pod of a local job at once, as root, the way ``kubectl
exec`` would on Kubernetes: the launch script's ``stacks`` (the hang watchdog) and ``notice``
(a killed task's ranks get SIGTERM before teardown)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from airflow_mpi.backends.sandbox import Sandbox
from airflow_mpi.exceptions import LaunchError


def running_pods(sandbox: Sandbox) -> list[str]:
    return [pod for pod in sandbox.pods if sandbox.started(pod) and sandbox.exit_code(pod) is None]


def run_in_pods(
    sandbox: Sandbox, pods: Sequence[str], argv: Sequence[str], timeout: float
) -> tuple[dict[str, str], dict[str, str]]:
    """Each pod's standard output (pod -> text), and the pods it could not run in or that
    failed (pod -> why: the last line of its standard error, or its exit code)."""
    outputs: dict[str, str] = {}
    errors: dict[str, str] = {}

    def ask(pod: str) -> None:
        try:
            done = sandbox.run_in(pod, argv, timeout=timeout)
        except (LaunchError, OSError, subprocess.SubprocessError) as error:
            errors[pod] = str(error)
            return
        if done.returncode != 0:
            errors[pod] = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        outputs[pod] = done.stdout

    if pods:
        with ThreadPoolExecutor(max_workers=min(32, len(pods))) as pool:
            list(pool.map(ask, pods))
    return outputs, errors
