"""The launch script and the Python renderer agree: the script's dry run, fed the rendered env and
files, prints exactly the argv the Python side computes, for a grid of role configurations."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi import contract
from airflow_mpi.contract import PodPaths
from airflow_mpi.job.mpirun import build_mpiexec_argv
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.observe.readiness import HostProblem, classify_ssh_result
from airflow_mpi.scripts import launch_script_text
from tests.helpers import IDENTITY, fixed_ssh, spec_from

GRID: list[tuple[str, dict[str, Any]]] = [
    ("cpu master only", {"master": {"cpu": 2}}),
    ("cpu 1+2", {"master": {"cpu": 1}, "workers": {"replicas": 2, "cpu": 1}}),
    ("cpu 4+3x8", {"master": {"cpu": 4}, "workers": {"replicas": 3, "cpu": 8}}),
    ("gpu both 2+2x2", {"master": {"gpus": 2}, "workers": {"replicas": 2, "gpus": 2}}),
    ("gpu workers only", {"master": {"cpu": "500m"}, "workers": {"replicas": 2, "gpus": 4}}),
    ("gpu master only", {"master": {"gpus": 8}}),
    ("hostfile cpu", {"hosts_mode": "hostfile", "master": {"cpu": 2}, "workers": {"replicas": 2, "cpu": 2}}),
    ("hostfile gpu workers", {"hosts_mode": "hostfile", "workers": {"replicas": 3, "gpus": 2}}),
    ("np override", {"master": {"cpu": 4}, "workers": {"replicas": 1, "cpu": 4}, "mpi": {"np": 5}}),
    (
        "every option",
        {
            "workers": {"replicas": 1},
            "env": {"NCCL_DEBUG": "INFO"},
            "mpi": {
                "npernode": 1, "pml": "ob1", "btl": "^openib", "btl_tcp_if_include": "eth0",
                "oob_tcp_if_exclude": "lo", "report_bindings": True, "display_map": True, "verbose": True,
                "help_aggregate": False, "quiet": True, "wdir": "/app dir", "env_file": "/app/env",
                "export_env": ["PATH", "X=a b"], "mca": {"btl_tcp_eager_limit": "1"},
                "extra_args": ["--merge-stderr-to-stdout"],
            },
        },
    ),
    (
        "awkward command",
        {"command": ["python", "-c", "import sys\nprint('it''s', sys.argv)", "a b", "$HOME", "*", "'\"", "--"]},
    ),
]  # fmt: skip


def materialize(plan: JobPlan, root: Path) -> tuple[PodPaths, dict[str, str]]:
    """Write the ConfigMap files where a pod would see them; return the master's environment."""
    paths = PodPaths(config_dir=str(root / "etc-mpi"), ssh_secret_dir=str(root / "ssh"), runtime_dir=str(root / "run"))
    Path(paths.config_dir).mkdir()
    for name, text in plan.config_files.items():
        (Path(paths.config_dir) / name).write_text(text)
    env = {
        "PATH": os.environ["PATH"],
        "LD_LIBRARY_PATH": "/opt/lib",
        **plan.master.env,
        contract.ENV_CONFIG_DIR: paths.config_dir,
        contract.ENV_SSH_SECRET_DIR: paths.ssh_secret_dir,
        contract.ENV_RUNTIME_DIR: paths.runtime_dir,
        contract.ENV_DRY_RUN: "1",
    }
    return paths, env


def dry_run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=20, check=False)


def exact_argv(exec_line: str) -> list[str]:
    """Let bash itself parse the printf %q line (exact for any text, newlines included)."""
    assert exec_line.startswith("exec ")
    done = subprocess.run(
        ["bash", "-c", 'eval "args=(${1#exec })"; printf "%s\\0" "${args[@]}"', "x", exec_line],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split("\0")[:-1]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "launch.sh"
    path.write_text(launch_script_text())
    return path


@pytest.mark.parametrize(("case", "fields"), GRID, ids=[g[0] for g in GRID])
def test_dry_run_matches_python_argv(case: str, fields: dict[str, Any], tmp_path: Path, script: Path) -> None:
    spec = spec_from(**fields)
    probe = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    paths, env = materialize(probe, tmp_path)
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec), paths=paths)
    (Path(paths.config_dir) / "mpiexec.args").write_text(plan.config_files["mpiexec.args"])
    if "hostfile" in plan.config_files:
        (Path(paths.config_dir) / "hostfile").write_text(plan.config_files["hostfile"])
    done = dry_run(script, env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"MPI_HOST={plan.master.env['MPI_HOST']}"
    assert lines[2] == f"MPI_NP={plan.topology.np}"
    python_argv = build_mpiexec_argv(spec, plan.topology, paths)
    assert exact_argv(lines[-1]) == python_argv
    assert not (tmp_path / "run").exists()  # dry run: no ssh material installed, no sshd


def test_unset_exported_variables_are_dropped_not_warned(tmp_path: Path, script: Path) -> None:
    spec = spec_from()
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    _, env = materialize(plan, tmp_path)
    del env["LD_LIBRARY_PATH"]
    argv = exact_argv(dry_run(script, env).stdout.splitlines()[-1])
    assert "LD_LIBRARY_PATH" not in argv and ("-x" in argv and "PATH" in argv)


def test_invalid_np_is_refused_by_the_script(tmp_path: Path, script: Path) -> None:
    spec = spec_from(workers={"replicas": 1, "gpus": 2})
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    _, env = materialize(plan, tmp_path)
    env["GJ_TRAINING_WORKER_REPLICAS"] = "0"
    env["MPI_HOST"] = ""
    done = dry_run(script, env)
    assert done.returncode == 1
    assert "ERROR: invalid MPI_NP=0" in done.stdout


def test_worker_dry_run_execs_sshd(tmp_path: Path, script: Path) -> None:
    spec = spec_from(workers={"replicas": 1})
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    _, env = materialize(plan, tmp_path)
    env.update(plan.workers[0].env)
    done = dry_run(script, env)
    assert done.returncode == 0
    assert done.stdout.strip().endswith(f"-D -e -f {tmp_path}/run/ssh/sshd_config")


def test_missing_platform_env_is_named(script: Path) -> None:
    done = dry_run(script, {"PATH": os.environ["PATH"], "GJ_TRAINING_ROLE": "master"})
    assert done.returncode == 1
    assert "GJ_TRAINING_POD_NAME" in done.stderr and "GJ_TRAINING_VC_JOB_NAME" in done.stderr


SSH_SAMPLES = [
    ("ssh: Could not resolve hostname w-0.job: Name or service not known", HostProblem.NOT_RESOLVING),
    ("ssh: connect to host w-0.job port 22: Connection refused", HostProblem.PORT_CLOSED),
    ("root@w-0.job: Permission denied (publickey).", HostProblem.KEY_REFUSED),
    ("Host key verification failed.", HostProblem.HOST_KEY_MISMATCH),
    ("ssh: connect to host w-0.job port 22: Connection timed out", HostProblem.NO_ANSWER),
    ("ssh: connect to host w-0.job port 22: No route to host", HostProblem.NO_ANSWER),
    ("kex_exchange_identification: read: Connection reset by peer", HostProblem.SSH_FAILED),
]


@pytest.mark.parametrize(("stderr", "problem"), SSH_SAMPLES)
def test_script_and_python_classify_ssh_failures_alike(
    stderr: str, problem: HostProblem, tmp_path: Path, script: Path
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text(f"#!/bin/bash\necho {stderr!r} >&2\nexit 255\n")
    (fake / "ssh").chmod(0o755)
    spec = spec_from(workers={"replicas": 1})
    plan = render_plan(spec, IDENTITY, ssh=fixed_ssh(spec))
    _, env = materialize(plan, tmp_path)
    env["PATH"] = f"{fake}:{env['PATH']}"
    del env[contract.ENV_DRY_RUN]
    done = subprocess.run(["bash", str(script), "check-hosts"], env=env, capture_output=True, text=True, timeout=20)
    assert done.returncode == 1
    assert done.stdout.split(": ", 1)[1].startswith(problem.value), done.stdout
    assert classify_ssh_result("w", 255, stderr).problem is problem
