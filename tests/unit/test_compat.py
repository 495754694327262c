"""The one place Airflow's version differences live (``airflow_mpi.compat``): every other module
imports Airflow only from public modules, the private names are used there alone, and each has
a fallback that works (the compatibility tier, tests/compat, runs the releases themselves)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi import compat

ROOT = Path(__file__).resolve().parents[2] / "airflow_mpi"

# The Airflow modules the package may import outside compat.py, and why each is public.
PUBLIC = {
    "airflow.sdk": "the Task SDK's public interface",
    "airflow.sdk.exceptions": "AirflowRuntimeError: the Task SDK's error for a failed API call, on every 3.x",
    "airflow.sdk.bases.decorator": "how Airflow's docs tell providers to build a @task decorator",
    "airflow.sdk.execution_time.xcom": "XCom.get_value, as Airflow's docs read an operator link's XCom",
    "airflow.sdk.types": "type annotations only",
    "airflow.triggers.base": "BaseTrigger and TriggerEvent, for every 3.x trigger",
    "airflow.providers.cncf.kubernetes.hooks.kubernetes": "the cncf-kubernetes provider's KubernetesHook",
}
PRIVATE_NAMES = ("_set_xcom_in_db", "_logger._file", "log_filename_template_renderer", "KNOWN_CONTEXT_KEYS")


def airflow_imports(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.append(node.module)
        elif isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
    return [m for m in modules if m == "airflow" or m.startswith("airflow.")]


def test_outside_compat_the_package_imports_only_public_airflow_modules() -> None:
    found = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in ROOT.rglob("*.py")
        if path.name != "compat.py"
        for module in airflow_imports(path)
        if module not in PUBLIC
    }
    assert found == set(), "import these through airflow_mpi.compat, with a version check and a fallback"


def test_private_airflow_names_appear_in_compat_alone() -> None:
    found = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in ROOT.rglob("*.py")
        if path.name != "compat.py"
        for name in PRIVATE_NAMES
        if name in path.read_text()
    }
    assert found == set()


def test_the_context_keys_come_from_the_public_context_type() -> None:
    assert {"ti", "task_instance", "dag_run", "params", "logical_date"} <= compat.context_keys()


def test_a_link_is_stored_through_the_xcom_push_where_the_database_write_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk.execution_time.xcom import XCom

    pushed: list[tuple[str, Any]] = []
    ti = SimpleNamespace(
        dag_id="d", task_id="t", run_id="r", map_index=-1, xcom_push=lambda key, value: pushed.append((key, value))
    )
    written: list[dict[str, Any]] = []
    monkeypatch.setattr(XCom, "_set_xcom_in_db", lambda **fields: written.append(fields), raising=True)
    compat.store_link(ti, "mpi_job_link", "https://dash/job")
    assert written == [
        {
            "key": "mpi_job_link",
            "value": "https://dash/job",
            "dag_id": "d",
            "task_id": "t",
            "run_id": "r",
            "map_index": -1,
        }
    ]
    assert pushed == []

    monkeypatch.delattr(XCom, "_set_xcom_in_db")
    compat.store_link(ti, "mpi_job_link", "https://dash/job")
    assert pushed == [("mpi_job_link", "https://dash/job")]


def test_the_declared_range_is_the_tested_range() -> None:
    """pyproject's apache-airflow range, the minors the compatibility tier runs and the releases
    the log socket was checked on agree."""
    from tests.cluster.test_airflow_releases import RELEASES

    pyproject = (ROOT.parent / "pyproject.toml").read_text()
    assert '"apache-airflow>=3.0,<3.4"' in pyproject
    assert sorted({".".join(version.split(".")[:2]) for version in RELEASES}) == ["3.0", "3.1", "3.2", "3.3"]
    assert compat.LOG_SOCKET_CHECKED
