"""What differs between the Airflow 3 releases this provider supports (3.0 to 3.3), in one place.

Every other module imports Airflow names that moved between releases from here, as Airflow's
own providers do (``version_compat``): the exceptions moved from ``airflow.exceptions`` to the
Task SDK in 3.2, ``BaseHook`` reached ``airflow.sdk`` in 3.1, and the async connection lookup
reached the common compat provider in 3.1. One version check per difference, decided once at
import, so a DAG file that imports the provider never fails on an older release.

Two things have no public API at all; both are checked on the releases the compatibility tier
runs (``tests/cluster/test_airflow_releases.py``) and fall back to plain, tested behaviour
anywhere else:

- ``store_link``: the "MPI job" link written to the metadata database while the job runs (as
  Airflow writes extra links when a task ends), else through the task instance's XCom push.
- ``trigger_log_fd``: the socket the trigger runner writes its log records to, so the log channel
  can write without blocking the loop; ``None`` (records written at once, through the trigger's
  own logger) on a release it was not checked on.
"""

from __future__ import annotations

import os
import socket
import stat
from typing import Any

import airflow
from packaging.version import Version

AIRFLOW_VERSION = Version(Version(airflow.__version__).base_version)
AIRFLOW_V_3_1_PLUS = Version("3.1.0") <= AIRFLOW_VERSION
AIRFLOW_V_3_2_PLUS = Version("3.2.0") <= AIRFLOW_VERSION
# The releases whose trigger runner's log socket was checked (the compatibility tier's range).
LOG_SOCKET_CHECKED = Version("3.0.0") <= AIRFLOW_VERSION < Version("3.4.0")

if AIRFLOW_V_3_2_PLUS:
    from airflow.sdk.exceptions import (
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSensorTimeout,
        TaskDeferred,
    )
else:  # pragma: no cover - Airflow 3.0 and 3.1 (the compatibility tier runs them)
    from airflow.exceptions import (  # type: ignore[no-redef,attr-defined]
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSensorTimeout,
        TaskDeferred,
    )

if AIRFLOW_V_3_1_PLUS:
    from airflow.sdk import BaseHook
else:  # pragma: no cover - Airflow 3.0
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef,attr-defined]

__all__ = [
    "AIRFLOW_VERSION",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSensorTimeout",
    "BaseHook",
    "TaskDeferred",
    "conf",
    "context_keys",
    "get_async_connection",
    "store_link",
    "task_states",
    "trigger_log_fd",
]


def conf() -> Any:
    """Airflow's configuration: the Task SDK's (3.1+) where the task runs, else the core's."""
    try:
        from airflow.sdk.configuration import conf as sdk_conf
    except ImportError:  # pragma: no cover - Airflow 3.0 and 3.1
        from airflow.configuration import conf as core_conf

        return core_conf
    return sdk_conf


def context_keys() -> frozenset[str]:
    """The names Airflow passes in a task's context (``airflow.sdk.Context``'s keys: public on
    every release, where ``KNOWN_CONTEXT_KEYS`` came only in 3.1)."""
    from airflow.sdk import Context

    return frozenset(Context.__annotations__)


async def get_async_connection(conn_id: str) -> Any:
    """A connection, looked up without blocking the triggerer's event loop."""
    try:  # the common compat provider's (as Airflow 3.1 resolves it: 1.14)
        from airflow.providers.common.compat.connection import get_async_connection as lookup
    except ImportError:  # Airflow 3.0's provider: in a thread, as its cncf-kubernetes provider does
        from asgiref.sync import sync_to_async

        return await sync_to_async(BaseHook.get_connection)(conn_id)
    return await lookup(conn_id)


def task_states(dag_id: str, task_ids: list[str], run_ids: list[str], map_index: int) -> dict[str, Any]:
    """Task instances' states (``{run_id: {task_id: state}}``, a mapped one's id with its index),
    asked of Airflow from a triggerer's trigger runner through its supervisor (the request
    ``ExternalTaskSensor``'s trigger makes). Blocking: call it from a thread. Raises where no
    supervisor answers (the trigger run outside a triggerer)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    states: dict[str, Any] = RuntimeTaskInstance.get_task_states(
        dag_id=dag_id, task_ids=task_ids, run_ids=run_ids, map_index=map_index
    )
    return states


def store_link(ti: Any, key: str, value: str) -> None:
    """Write an operator link's value under ``key`` for the running task instance ``ti``.

    Airflow writes extra links to the metadata database itself (never to a custom XCom backend,
    because the API server reads links from the database); it has no public call for that, so on
    the releases that have it this uses the same one, else the task instance's own XCom push
    (right with the default XCom backend, a reference with a custom one)."""
    from airflow.sdk.execution_time.xcom import XCom

    to_db = getattr(XCom, "_set_xcom_in_db", None)
    if to_db is None:
        ti.xcom_push(key=key, value=value)
        return
    to_db(key=key, value=value, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=ti.map_index)


def trigger_log_fd() -> int | None:
    """The fd of the Unix stream socket this process's structlog writes records to (Airflow's
    trigger runner sends them to its supervisor so), on the releases where that was checked;
    None anywhere else, or for a file, a pipe, a terminal: records are then written at once."""
    if not LOG_SOCKET_CHECKED:
        return None
    try:
        import structlog

        bound: Any = structlog.get_logger().bind()
        fd = bound._logger._file.fileno()  # structlog's BytesLogger over the runner's log socket
        mode = os.fstat(fd).st_mode
    except Exception:
        return None
    if not stat.S_ISSOCK(mode):
        return None
    with socket.socket(fileno=os.dup(fd)) as probe:
        if probe.family != socket.AF_UNIX or probe.type != socket.SOCK_STREAM:
            return None
    return int(fd)
