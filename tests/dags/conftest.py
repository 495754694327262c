"""Airflow-level fixtures: a migrated database (once per session), DAGs from the DAGs folder,
XCom and task states after dag.test(), and the leak check."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import STATE_DIR
from tests.leaks import ours


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
    yield
    assert not ours(), f"leaked: {ours()}"
    left = [p.name for p in STATE_DIR.iterdir() if p.name != ".lock"] if STATE_DIR.exists() else []
    assert not left, f"local jobs left: {left}"


def xcom(dag_run: Any, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key="return_value")
        ).all()
        return rows[0].value if rows else None


def task_states(dag_run: Any) -> dict[str, str]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances(session=session)}
