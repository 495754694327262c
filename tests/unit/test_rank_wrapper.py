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
