"""The mpiexec command line: golden defaults, and every typed option."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.job.mpirun import build_mpiexec_argv, build_mpiexec_tail, render_args_file
from airflow_mpi.job.naming import build_job_name
from airflow_mpi.job.topology import build_topology
from airflow_mpi.scripts import launch_script_text
from tests.helpers import IDENTITY, spec_from

J = build_job_name("job", IDENTITY)


def argv_for(**fields: Any) -> list[str]:
    spec = spec_from(**fields)
    return build_mpiexec_argv(spec, build_topology(spec, J))


def test_default_argv_golden() -> None:
    assert argv_for(workers={"replicas": 2}) == [
        "mpiexec", "--allow-run-as-root",
        "--host", f"{J}-master-0.{J}:1,{J}-worker-0.{J}:1,{J}-worker-1.{J}:1",
        "-np", "3",
        "--map-by", "slot", "--bind-to", "none",
        "--mca", "orte_abort_on_non_zero_status", "1",
        "--mca", "orte_keep_fqdn_hostnames", "1",
        "--mca", "plm_rsh_args", "-F /run/airflow-mpi/ssh/ssh_config",
        "--mca", "plm_rsh_no_tree_spawn", "1",
        "--timeout", "86400", "--report-state-on-timeout",
        "--tag-output",
        "-x", "PATH", "-x", "LD_LIBRARY_PATH",
        "-x", f"MASTER_ADDR={J}-master-0.{J}", "-x", "MASTER_PORT=29500",
        "-x", f"AIRFLOW_MPI_RANK_PODS={J}-master-0,{J}-worker-0,{J}-worker-1",
        "bash", "/etc/mpi/launch.sh", "rank", "python", "/app/train.py",
    ]  # fmt: skip


def test_hostfile_mode_uses_hostfile_never_host() -> None:
    argv = argv_for(workers={"replicas": 1}, hosts_mode="hostfile")
    assert argv[2:4] == ["--hostfile", "/etc/mpi/hostfile"]
    assert "--host" not in argv


def pairs(argv: list[str]) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for i, arg in enumerate(argv):
        out.add((arg,))
        if i + 1 < len(argv):
            out.add((arg, argv[i + 1]))
        if arg == "--mca" and i + 2 < len(argv):
            out.add((arg, argv[i + 1], argv[i + 2]))
    return out


OPTIONS: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({"npernode": 1}, ("--npernode", "1")),
    ({"oversubscribe": True}, ("--oversubscribe",)),
    ({"pml": "ob1"}, ("--mca", "pml", "ob1")),
    ({"btl": "^openib"}, ("--mca", "btl", "^openib")),
    ({"btl": "tcp,self"}, ("--mca", "btl", "tcp,self")),
    ({"btl_tcp_if_include": "eth0"}, ("--mca", "btl_tcp_if_include", "eth0")),
    ({"btl_tcp_if_exclude": "lo,docker0"}, ("--mca", "btl_tcp_if_exclude", "lo,docker0")),
    ({"oob_tcp_if_include": "eth0"}, ("--mca", "oob_tcp_if_include", "eth0")),
    ({"oob_tcp_if_exclude": "lo"}, ("--mca", "oob_tcp_if_exclude", "lo")),
    ({"bind_to": "core"}, ("--bind-to", "core")),
    ({"map_by": "node"}, ("--map-by", "node")),
    ({"report_bindings": True}, ("--report-bindings",)),
    ({"export_env": ["NCCL_DEBUG=INFO"]}, ("-x", "NCCL_DEBUG=INFO")),
    ({"env_file": "/app/env"}, ("-x", "AIRFLOW_MPI_ENV_FILE=/app/env")),
    ({"verbose": True}, ("-v",)),
    ({"debug": True}, ("--debug-daemons",)),
    ({"help_aggregate": False}, ("--mca", "orte_base_help_aggregate", "0")),
    ({"display_map": True}, ("--display-map",)),
    ({"no_tree_spawn": True}, ("--mca", "plm_rsh_no_tree_spawn", "1")),
    ({"leave_session_attached": True}, ("--leave-session-attached",)),
    ({"quiet": True}, ("-q",)),
    ({"tag_output": True}, ("--tag-output",)),
    ({"wdir": "/app"}, ("-wdir", "/app")),
    ({"mca": {"btl_tcp_eager_limit": "65536"}}, ("--mca", "btl_tcp_eager_limit", "65536")),
    ({"extra_args": ["--merge-stderr-to-stdout"]}, ("--merge-stderr-to-stdout",)),
    ({"master_port": 23456}, ("-x", "MASTER_PORT=23456")),
]


@pytest.mark.parametrize(("mpi", "expected"), OPTIONS, ids=[str(o[0]) for o in OPTIONS])
def test_typed_option_renders(mpi: dict[str, Any], expected: tuple[str, ...]) -> None:
    argv = argv_for(mpi=mpi, workers={"replicas": 1})
    assert expected in pairs(argv)
    assert argv[-3:] == ["rank", "python", "/app/train.py"]  # options never follow the command


@pytest.mark.parametrize(
    ("mpi", "absent"),
    [
        ({"tag_output": False}, "--tag-output"),
        ({"no_tree_spawn": False}, "plm_rsh_no_tree_spawn"),
        ({}, "--oversubscribe"),
        ({}, "--debug"),
    ],
)
def test_disabled_options_are_absent(mpi: dict[str, Any], absent: str) -> None:
    assert absent not in argv_for(mpi=mpi)


def test_job_timeout_is_mpiexec_timeout_and_abort_is_always_on() -> None:
    argv = argv_for(timeout=3600)
    assert ("--timeout", "3600") in pairs(argv)
    assert ("--mca", "orte_abort_on_non_zero_status", "1") in pairs(argv)


def test_user_env_is_exported_to_ranks() -> None:
    argv = argv_for(env={"NCCL_DEBUG": "WARN", "PATH_EXTRA": "/x"}, mpi={"export_env": ["PATH", "NCCL_DEBUG=INFO"]})
    exports = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert exports[:3] == ["PATH", "NCCL_DEBUG=INFO", "PATH_EXTRA"]  # NCCL_DEBUG not exported twice


def test_args_file_is_a_quoted_bash_array() -> None:
    spec = spec_from(command=["python", "-c", "print('a b')\nprint(\"$HOME\")"])
    text = render_args_file(spec, build_mpiexec_tail(spec, build_topology(spec, J)))
    assert text.startswith("MPI_IMPLEMENTATION=openmpi\nMPI_LAUNCHER=mpiexec\nMPI_LAUNCH_ENV=(\n)\n")
    assert "\nMPI_ARGS_RENDERED=(\n" in text and text.endswith(")\n")
    assert "'\"'\"'" in text  # single quotes inside single-quoted words


def test_hydra_argv_golden() -> None:
    """MPICH and Intel MPI: the same job in Hydra's spelling, its ssh launch and time limit in
    the launcher's environment, only the exported names passed to ranks."""
    argv = argv_for(
        workers={"replicas": 2},
        hosts_mode="hostfile",
        env={"JOB_VAR": "x"},
        mpi={"implementation": "mpich", "mpiexec": "/usr/bin/mpiexec.mpich", "npernode": 1, "bind_to": "core"},
    )
    assert argv == [
        "env", "HYDRA_LAUNCHER=ssh", "HYDRA_LAUNCHER_EXTRA_ARGS=-F /run/airflow-mpi/ssh/ssh_config",
        "MPIEXEC_TIMEOUT=86400",
        "/usr/bin/mpiexec.mpich",
        "-machinefile", "/run/airflow-mpi/hosts", "-localhost", f"{J}-master-0.{J}",
        "-np", "3",
        "-bind-to", "core", "-ppn", "1",
        "-genvlist", "PATH,LD_LIBRARY_PATH,JOB_VAR",
        "-genv", "MASTER_ADDR", f"{J}-master-0.{J}", "-genv", "MASTER_PORT", "29500",
        "-genv", "AIRFLOW_MPI_RANK_PODS", f"{J}-master-0,{J}-worker-0,{J}-worker-1",
        "-genv", "AIRFLOW_MPI_ABORT_ON_EXIT", "1", "-genv", "AIRFLOW_MPI_TAG_OUTPUT", "1",
        "bash", "/etc/mpi/launch.sh", "rank", "python", "/app/train.py",
    ]  # fmt: skip
    assert argv_for(mpi={"implementation": "intel"})[4:6] == ["mpiexec", "-machinefile"]  # the same spelling


def test_hydra_args_file_names_its_launcher_and_environment() -> None:
    spec = spec_from(mpi={"implementation": "intel", "mpiexec": "/opt/intel/bin/mpiexec"})
    text = render_args_file(spec, build_mpiexec_tail(spec, build_topology(spec, J)))
    assert text.startswith("MPI_IMPLEMENTATION=intel\nMPI_LAUNCHER=/opt/intel/bin/mpiexec\nMPI_LAUNCH_ENV=(\n")
    assert "  'I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS=-F /run/airflow-mpi/ssh/ssh_config'\n" in text
    assert "  I_MPI_JOB_TIMEOUT=86400\n" in text


def test_open_mpi_5_argv_golden() -> None:
    """PRRTE's names for the same job: plm_ssh_*, prte_keep_fqdn_hostnames, --npernode as a
    mapping, and the rank wrapper's tags instead of --output tag's (which add a space)."""
    spec = spec_from(workers={"replicas": 1}, mpi={"npernode": 1, "oversubscribe": True, "quiet": True})
    assert build_mpiexec_argv(spec, build_topology(spec, J), open_mpi=5) == [
        "mpiexec", "--allow-run-as-root", "--host", f"{J}-master-0.{J}:1,{J}-worker-0.{J}:1", "-np", "2",
        "--map-by", "ppr:1:node:OVERSUBSCRIBE", "--bind-to", "none",
        "--mca", "prte_keep_fqdn_hostnames", "1",
        "--mca", "plm_ssh_args", "-F /run/airflow-mpi/ssh/ssh_config",
        "--mca", "plm_ssh_no_tree_spawn", "1",
        "--timeout", "86400", "--report-state-on-timeout",
        "-x", "PATH", "-x", "LD_LIBRARY_PATH",
        "-x", f"MASTER_ADDR={J}-master-0.{J}", "-x", "MASTER_PORT=29500",
        "-x", f"AIRFLOW_MPI_RANK_PODS={J}-master-0,{J}-worker-0",
        "-x", "AIRFLOW_MPI_TAG_OUTPUT=1",
        "bash", "/etc/mpi/launch.sh", "rank", "python", "/app/train.py",
    ]  # fmt: skip


def test_an_open_mpi_args_file_carries_both_tails() -> None:
    from airflow_mpi.job.plan import render_plan

    plan = render_plan(spec_from(), IDENTITY)
    text = plan.config_files["mpiexec.args"]
    assert "\nMPI_ARGS_RENDERED=(\n" in text and "\nMPI_ARGS_RENDERED_OPEN_MPI_5=(\n" in text
    assert "plm_rsh_args" in text.split("MPI_ARGS_RENDERED_OPEN_MPI_5")[0]
    assert "plm_ssh_args" in text.split("MPI_ARGS_RENDERED_OPEN_MPI_5")[1]
    hydra = render_plan(spec_from(mpi={"implementation": "mpich"}), IDENTITY).config_files["mpiexec.args"]
    assert "OPEN_MPI_5" not in hydra


def test_hydra_passes_no_environment_but_the_jobs_when_no_name_is_exported(tmp_path: Path) -> None:
    """Without -genvlist Hydra would pass the master's whole environment to every rank."""
    spec = spec_from(mpi={"implementation": "mpich", "export_env": ["A=1"]})
    tail = build_mpiexec_tail(spec, build_topology(spec, J))
    assert "-genvnone" in tail and "-genvlist" not in tail
    # The launch script drops the names it has no value for: none left is -genvnone, not nothing.
    script = tmp_path / "launch.sh"
    script.write_text(launch_script_text())
    run = (
        f'AIRFLOW_MPI_LAUNCH_LIBRARY=1; source "{script}"; '
        "MPI_ARGS_RENDERED=(-genvlist UNSET_ONE,UNSET_TWO -genv A 1 bash /etc/mpi/launch.sh rank true); "
        'load_mpiexec_args; printf "%s\\n" "${MPI_ARGS[@]}"'
    )
    shown = subprocess.run(["bash", "-c", run], capture_output=True, text=True, timeout=20, check=True).stdout
    assert shown.split("\n")[:4] == ["-genvnone", "-genv", "A", "1"]
