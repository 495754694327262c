"""Integration fixtures: a private local-backend state directory, and a leak check after every
test (no network namespace, bridge, veth, sshd, orted or mpiexec of ours may be left)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_mpi.backends.local import LocalBackend, check_prerequisites
from tests.leaks import ours

STATE_ROOT = Path("/run/airflow-mpi-tests")
SHARED_ROOT = Path("/var/tmp/airflow-mpi-tests")  # not /tmp: every pod has a private /tmp


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = check_prerequisites()
    if not problems:
        return
    if os.environ.get("AIRFLOW_MPI_REQUIRE_INTEGRATION"):
        raise pytest.UsageError("integration tests cannot run here; missing: " + "; ".join(problems))
    skip = pytest.mark.skip(reason="needs " + "; ".join(problems))
    for item in items:
        if "integration" in str(item.fspath) or "dags" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def state_root() -> Iterator[Path]:
    root = STATE_ROOT / uuid.uuid4().hex[:8]
    root.mkdir(parents=True, mode=0o700)
    yield root
    leftovers = [p.name for p in root.iterdir() if p.name != ".lock"] if root.exists() else []
    shutil.rmtree(root, ignore_errors=True)
    assert not leftovers, f"local backend state left behind: {leftovers}"


@pytest.fixture(scope="session", autouse=True)
def no_leaks_at_session_end() -> Iterator[None]:
    before = ours()
    yield
    assert ours() == before, "the test session left namespaces, links or processes behind"


@pytest.fixture
def backend(state_root: Path) -> Iterator[LocalBackend]:
    yield LocalBackend(state_dir=state_root)
    left = ours()
    assert not left, f"leaked: {left}"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every pod sees at the same path (for data, markers, env files)."""
    path = SHARED_ROOT / uuid.uuid4().hex[:8]
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)
