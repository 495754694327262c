"""Session setup shared by every test directory.

Airflow reads its configuration at import time, so its home is prepared here, before any test
module imports it: a fresh home per session whose DAGs folder holds the example DAG (with its
training script) and the test DAGs, and an ``mpi_default`` connection pointing the local backend
at a state directory of the tests' own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults import fault_row  # noqa: F401 (the fault table's fixture, for every test dir)

REPO = Path(__file__).resolve().parent.parent
# Not under /tmp: every local pod has a private /tmp, and the example's script must be visible.
SHARED = Path("/var/tmp/airflow-mpi-tests")
SHARED.mkdir(parents=True, exist_ok=True)
HOME = Path(tempfile.mkdtemp(prefix="home-", dir=SHARED))
STATE_DIR = Path("/run/airflow-mpi-tests") / f"dags-{os.getpid()}"
DEMO_DATA = SHARED / f"demo-{os.getpid()}"

shutil.copytree(REPO / "dags", HOME / "dags", ignore=shutil.ignore_patterns("__pycache__"))
for dag_file in (REPO / "tests" / "dags" / "dagfiles").glob("*.py"):
    shutil.copy(dag_file, HOME / "dags" / dag_file.name)

os.environ["AIRFLOW_HOME"] = str(HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(HOME / "dags")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["MPI_DEMO_DATA"] = str(DEMO_DATA)
# Hypothesis keeps its caches (and failing examples' patches) in the session's home, not the tree.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(HOME / "hypothesis"))
os.environ["AIRFLOW_CONN_MPI_DEFAULT"] = json.dumps(
    {"conn_type": "mpi", "extra": {"backend": "local", "state_dir": str(STATE_DIR)}}
)


@pytest.fixture(scope="session")
def airflow_db() -> None:
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def dagbag(airflow_db: None) -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag()
    assert not bag.import_errors, bag.import_errors
    return bag


@pytest.fixture
def no_leaks() -> Iterator[None]:
    from tests.leaks import ours

    yield
    assert not ours(), f"leaked: {ours()}"
    left = [p.name for p in STATE_DIR.iterdir() if p.name != ".lock"] if STATE_DIR.exists() else []
    assert not left, f"local jobs left: {left}"


def pytest_sessionfinish() -> None:
    shutil.rmtree(HOME, ignore_errors=True)
    shutil.rmtree(DEMO_DATA, ignore_errors=True)
    # The state directory goes when nothing but its lock file is left (a leak stays visible). The
    # k8s tier's kubelet removes its own: another session may be using it (tests/lanes.py).
    if STATE_DIR.exists() and not [p for p in STATE_DIR.iterdir() if p.name != ".lock"]:
        shutil.rmtree(STATE_DIR, ignore_errors=True)
    for root in (STATE_DIR.parent, SHARED):
        with contextlib.suppress(OSError):
            root.rmdir()  # only if empty


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (CI's timeout, ``kill``) ends the run as Ctrl-C does: pytest then runs every
    fixture's teardown, so no cluster, sandbox or process of a test outlives the run."""
    signal.signal(signal.SIGTERM, _interrupted)
