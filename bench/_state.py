"""What the benchmarks share: their own local-backend state directory, removed when empty."""

from __future__ import annotations

import shutil
from pathlib import Path

STATE_DIR = "/run/airflow-mpi-bench"


def remove_state_dir() -> None:
    """Nothing but the lock file left (every job removed): the directory goes too."""
    state = Path(STATE_DIR)
    if state.exists() and not [p for p in state.iterdir() if p.name != ".lock"]:
        shutil.rmtree(state)
