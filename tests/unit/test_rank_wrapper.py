"""The rank wrapper's first line and the launch script's "starting mpiexec" line are what the
world-size check parses (docs/contract.md#rank-start)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from airflow_mpi import contract
from airflow_mpi.observe.worldsize import RANK_START
from airflow_mpi.scripts import launch_script_text


def test_a_rank_reports_rank_size_and_pod_before_anything_else(tmp_path: Path) -> None:
    script = tmp_path / "launch.sh"
    script.write_text(launch_script_text())
    env = {
        "PATH": os.environ["PATH"],
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        contract.ENV_CONFIG_DIR: str(tmp_path),
    }
    done = subprocess.run(
        ["bash", str(script), "rank", "bash", "-c", 'echo "user command: $RANK/$WORLD_SIZE"'],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    first, second = done.stdout.splitlines()
    pod = socket.gethostname().split(".")[0]
    assert first == f"{contract.RANK_START_PREFIX}rank=3 size=4 host={pod}"
    match = RANK_START.match(first)
    assert match is not None and match.groups() == ("3", "4", pod)
    assert second == "user command: 3/4"


def test_the_script_prints_the_line_the_check_starts_its_clock_at() -> None:
    text = launch_script_text()
    assert "log() { printf '[airflow-mpi] %s\\n' \"$*\"; }" in text
    assert contract.MPIEXEC_START_LINE == "[airflow-mpi] starting mpiexec"
    starting = text.index('log "starting mpiexec: ${MPI_NP} rank(s)"')
    assert text.index('exec "${cmd[@]}"', starting) - starting < 200  # right before it execs mpiexec


def _rank_line(tmp_path: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "launch.sh"
    script.write_text(launch_script_text())
    env = {"PATH": os.environ["PATH"], contract.ENV_CONFIG_DIR: str(tmp_path), **extra}
    return subprocess.run(
        ["bash", str(script), "rank", "bash", "-c", 'echo "user command: $RANK/$WORLD_SIZE"'],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_under_hydra_a_rank_is_hydras_whatever_open_mpis_variables_say(tmp_path: Path) -> None:
    # Hydra never sets OMPI_COMM_WORLD_*: a job's env could, and every rank would be rank 0.
    hydra = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    set_by_the_job = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "9"}
    done = _rank_line(tmp_path, {**hydra, **set_by_the_job, "AIRFLOW_MPI_ABORT_ON_EXIT": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "user command: 2/3"
    # In an Open MPI job they are Open MPI's own (it overwrites a job's), and read first.
    assert "rank=0 size=9 " in _rank_line(tmp_path, {**hydra, **set_by_the_job}).stdout


def test_a_rank_that_is_not_a_number_stops_before_anything_runs(tmp_path: Path) -> None:
    done = _rank_line(tmp_path, {"OMPI_COMM_WORLD_RANK": "0/;e id>/tmp/x;s/^/", "OMPI_COMM_WORLD_SIZE": "3"})
    assert done.returncode != 0
    assert "rank and world size are not numbers (rank '0/;e id>/tmp/x;s/^/', size '3')" in done.stderr
    assert "user command" not in done.stdout
