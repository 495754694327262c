"""sshd gives its sessions the pod's PATH and LD_LIBRARY_PATH, so mpiexec finds orted on a worker
wherever the image's PATH has it (docs/contract.md#orted-command-not-found)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_mpi.job.plan import render_plan
from tests.helpers import IDENTITY, fixed_ssh, spec_from
from tests.unit.test_launch_script import dry_run, exact_argv, materialize


@pytest.fixture
def worker_env(tmp_path: Path) -> dict[str, str]:
    spec = spec_from(workers={"replicas": 1})
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    _, env = materialize(plan, tmp_path)
    env.update(plan.workers[0].env)
    return env


def sshd_argv(script: Path, env: dict[str, str]) -> list[str]:
    done = dry_run(script, env)
    assert done.returncode == 0, done.stderr
    return exact_argv(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    ("path", "library_path", "set_env"),
    [
        ("/opt/ompi/bin:/usr/bin:/bin", "/opt/ompi/lib", "SetEnv PATH=/opt/ompi/bin:/usr/bin:/bin LD_LIBRARY_PATH=/opt/ompi/lib"),
        ("/usr/local/bin:/usr/bin:/bin", None, "SetEnv PATH=/usr/local/bin:/usr/bin:/bin"),
        ("/opt/my tools/bin:/usr/bin:/bin", "/opt/lib", "SetEnv LD_LIBRARY_PATH=/opt/lib"),  # a space: left out
        ('/usr/bin:/bin:/x"y', None, None),  # a quote: sshd_config could not carry it
    ],
)  # fmt: skip
def test_worker_sshd_passes_the_pods_paths_to_sessions(
    path: str, library_path: str | None, set_env: str | None, worker_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "launch.sh"
    from airflow_mpi.scripts import launch_script_text

    script.write_text(launch_script_text())
    env = {**worker_env, "PATH": path}
    env.pop("LD_LIBRARY_PATH", None)
    if library_path is not None:
        env["LD_LIBRARY_PATH"] = library_path
    argv = sshd_argv(script, env)
    expected_tail = ["-D", "-e", "-f", f"{tmp_path}/run/ssh/sshd_config"]
    assert argv == ["/usr/sbin/sshd", *(["-o", set_env] if set_env else []), *expected_tail]
