"""The DAG the README and the getting-started page show, taken from their own text and run as
written (``dag.test()``, the local backend): saved beside the checkout's ``scripts/`` as the pages
say, it preprocesses, trains on three ranks and evaluates, with the warning that the missing
``mpi_default`` connection means the local backend."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.airflow_helpers import task_states, xcom

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]


def dag_block(page: Path, heading: str) -> str:
    """The first Python block after ``heading`` on ``page``."""
    text = page.read_text()
    found = re.search(r"```python\n(.*?)```", text[text.index(heading) :], flags=re.S)
    assert found, f"{page.name}: no Python block after {heading!r}"
    return found.group(1)


def test_the_readme_and_getting_started_show_the_same_dag() -> None:
    assert dag_block(REPO / "README.md", "## A DAG") == dag_block(REPO / "docs/getting-started.md", "## Your first DAG")


@contextmanager
def saved_in_the_dags_folder(source: str) -> Iterator[Path]:
    """The DAG saved as the pages say: in the DAGs folder Airflow is given (the suite's copy of
    the checkout's ``dags/``, beside ``scripts/``; not under /tmp: the ranks run its script)."""
    from tests.conftest import HOME

    path = HOME / "dags" / "docs_digits.py"
    path.write_text(source)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def dag_file() -> Iterator[Path]:
    with saved_in_the_dags_folder(dag_block(REPO / "README.md", "## A DAG")) as path:
        yield path


def test_the_documented_dag_runs_as_written(
    airflow_db: None, dag_file: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.delenv("AIRFLOW_CONN_MPI_DEFAULT")  # as on a fresh install: no connection at all
    monkeypatch.setattr("airflow_mpi.hooks.mpi._WARNED_MISSING", set())  # warned once a process
    bag = DagBag(dag_folder=str(dag_file))
    assert not bag.import_errors, bag.import_errors
    dag_run: Any = bag.get_dag("digits").test()
    out = capfd.readouterr().out
    try:
        assert task_states(dag_run) == {"preprocess": "success", "train": "success", "evaluate": "success"}, out[-4000:]
        assert xcom(dag_run, "evaluate") >= 0.85
        assert out.count("No connection 'mpi_default': this job runs on the local backend") == 1
        assert re.search(r"<stdout>:epoch 12/12 loss", out), out[-3000:]  # the ranks' lines, live
    finally:
        shutil.rmtree(xcom(dag_run, "preprocess"), ignore_errors=True)  # the run's data folder
