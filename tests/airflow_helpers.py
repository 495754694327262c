"""Reading what a dag.test() run left in the Airflow database."""

from __future__ import annotations

from typing import Any


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


def api_client(monkeypatch: Any) -> Any:
    """Airflow's own REST API (the one its UI calls), in this process: every caller an admin, the
    connection test enabled."""
    from fastapi.testclient import TestClient

    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    from airflow.api_fastapi.app import create_app

    return TestClient(create_app("core"))


def extra_links(client: Any, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
    """What the task instance's Details tab shows under "Extra Links" (name -> URL or None)."""
    from urllib.parse import quote

    url = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/links"
    response = client.get(url, params={"map_index": map_index})
    assert response.status_code == 200, response.text
    return dict(response.json()["extra_links"])
