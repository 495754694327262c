"""Run inside a virtualenv of one Airflow release with the provider's wheel installed (never this
checkout: it imports nothing from ``tests``), by ``test_airflow_releases.py``:

    python release_check.py dags|reattach|form|socket|pycompat

``dags``: the compat DAG through ``dag.test()`` against the real control plane (the connection
``mpi_compat``): the results, the task states and each task's stored "MPI job" link;
``reattach``: a first try SIGKILLed mid-run, a second that reattaches; ``form``: the connection
form's fields as this release's ProvidersManager reads them; ``socket``: the trigger runner's log
socket found behind this release's logging setup; ``pycompat``: the timeouts and notes of
``airflow_mpi.triggers.timeouts`` and the runner on this Python. Prints one JSON line, last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

CONN_ID = "mpi_compat"
LINES = 60
RETRY_PROGRAM = (
    "import os, time, json\n"
    "if os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n"
    f"    for i in range({LINES}): print(f'step {{i:03d}}', flush=True); time.sleep(0.1)\n"
    f"    print('AIRFLOW_MPI_RESULT ' + json.dumps({{'steps': {LINES}}}))\n"
)
RETRY_JOB = {
    "name": "retried",
    "image": "registry.example/compat:1",
    "command": [sys.executable, "-c", RETRY_PROGRAM],
    "workers": {"replicas": 1},
    "startup_timeout": 90,
    "timeout": 120,
}
FIRST_TRY = """
import json, sys
from types import SimpleNamespace
sys.path.insert(0, sys.argv[3])
from release_check import FileStore
from airflow_mpi.operators.mpi import MPIJobOperator
operator = MPIJobOperator(task_id="train", job=json.loads(sys.argv[1]), mpi_conn_id="mpi_compat")
ti = SimpleNamespace(dag_id="compat", task_id="train", run_id=sys.argv[2], map_index=-1, try_number=1,
                     xcom_push=lambda **kw: None)
operator.execute({"ti": ti, "task_state_store": FileStore(sys.argv[4])})
"""


class FileStore:
    """Stands for Airflow 3.3's task_state_store, in a file two processes (two tries) share. A
    write replaces the file whole (as the real store's row is written in one transaction), so the
    other process never reads a half-written file."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def _write(self, data: dict[str, Any]) -> None:
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        partial.write_text(json.dumps(data))
        os.replace(partial, self.path)

    def get(self, key: str, default: Any = None) -> Any:
        return self._read().get(key, default)

    def set(self, key: str, value: Any) -> None:
        data = self._read()
        data[key] = value
        self._write(data)

    def delete(self, key: str) -> None:
        data = self._read()
        data.pop(key, None)
        self._write(data)


def check_dags() -> dict[str, Any]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.0 and 3.1
        from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])  # examples: off in the environment
    if bag.import_errors:
        return {"import_errors": {str(k): str(v)[-2000:] for k, v in bag.import_errors.items()}}
    dag_run = bag.get_dag("compat").test()
    with create_session() as session:
        tis = dag_run.get_task_instances(session=session)
        states = {f"{ti.task_id}[{ti.map_index}]": str(getattr(ti.state, "value", ti.state)) for ti in tis}
        rows = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id)).all()
        xcoms = [(row.task_id, row.map_index, row.key, row.value) for row in rows]
    return {"states": states, "xcoms": {f"{task_id}[{index}]:{key}": value for task_id, index, key, value in xcoms}}


def check_reattach(run_id: str, store: str) -> dict[str, Any]:
    from airflow_mpi.operators.mpi import MPIJobOperator

    here = str(Path(__file__).parent)
    out = Path(store).with_suffix(".first.log")
    with out.open("wb") as handle:
        child = subprocess.Popen(
            [sys.executable, "-c", FIRST_TRY, json.dumps(RETRY_JOB), run_id, here, store],
            stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            progress = (FileStore(store).get("airflow_mpi") or {}).get("lines", 0)
            if progress >= 20 or child.poll() is not None:
                break
            time.sleep(0.05)
        first_alive = child.poll() is None
    finally:
        os.kill(child.pid, signal.SIGKILL)  # a worker that dies runs no finally
        child.wait()
    first = [line.split("step ", 1)[1][:3] for line in out.read_text(errors="replace").splitlines() if "step " in line]
    lines: list[str] = []
    operator = MPIJobOperator(task_id="train", job=RETRY_JOB, mpi_conn_id=CONN_ID)
    operator.log.info = lambda text, *args: lines.append(text % args)  # type: ignore[method-assign]
    ti = SimpleNamespace(dag_id="compat", task_id="train", run_id=run_id, map_index=-1, try_number=2,
                         xcom_push=lambda **kw: None)  # fmt: skip
    result = operator.execute({"ti": ti, "task_state_store": FileStore(store)})  # type: ignore[arg-type]
    second = [line.split("step ", 1)[1][:3] for text in lines for line in text.splitlines() if "step " in line]
    return {
        "first_alive_at_kill": first_alive,
        "first": first,
        "second": second,
        "reattached": any("reattached to" in text for text in lines),
        "result": result["result"],
    }


def check_form() -> dict[str, Any]:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    hook = manager.hooks.get("mpi")
    widgets = sorted(key for key in manager.connection_form_widgets if key.startswith("extra__mpi__"))
    behaviour = manager.field_behaviours.get("mpi") or {}
    return {
        "hook": hook.hook_name if hook else None,
        "testable": bool(hook and hook.connection_testable),
        "fields": [key.removeprefix("extra__mpi__") for key in widgets],
        "hidden": sorted(behaviour.get("hidden_fields", [])),
    }


def check_log_socket() -> dict[str, Any]:
    """As this release's trigger runner sets up its logging (``configure_logging`` over the log
    socket its supervisor passes; its first argument was renamed in 3.1): does the log channel
    find that socket?"""
    import socket

    from airflow.sdk.log import configure_logging

    from airflow_mpi.compat import LOG_SOCKET_CHECKED, trigger_log_fd

    runner, _supervisor = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # the supervisor's end stays open
    log_io = os.fdopen(os.dup(runner.fileno()), "wb", buffering=0)
    try:
        configure_logging(json_output=True, output=log_io, sending_to_supervisor=True)
    except TypeError:  # Airflow 3.0
        configure_logging(enable_pretty_log=False, output=log_io, sending_to_supervisor=True)
    fd = trigger_log_fd()
    found = fd is not None and os.path.samestat(os.fstat(fd), os.fstat(runner.fileno()))
    return {"checked": LOG_SOCKET_CHECKED, "found": found}


def check_pycompat() -> dict[str, Any]:
    """What differs between Pythons (``asyncio.timeout``, ``add_note``) behaves here as on 3.11."""
    import asyncio

    from airflow_mpi.runner.job import add_note
    from airflow_mpi.triggers.timeouts import timeout_after

    async def bounded(delay: float, work: float) -> tuple[str, bool]:
        bound = timeout_after(delay)
        try:
            async with bound:
                await asyncio.sleep(work)
        except TimeoutError:  # the builtin one, as on 3.11+
            return "TimeoutError", bound.expired()
        return "done", bound.expired()

    error = RuntimeError("failed")
    add_note(error, "teardown left: pod x")
    return {
        "expired": asyncio.run(bounded(0.05, 5)),
        "in_time": asyncio.run(bounded(5, 0.01)),
        "notes": list(getattr(error, "__notes__", [])),
    }


# The checks that take arguments run alone; the others run together in one interpreter (each
# start imports Airflow: seconds of CPU): ``release_check.py form socket pycompat``.
WITH_ARGUMENTS = {"dags": check_dags, "reattach": check_reattach}
PLAIN = {"form": check_form, "socket": check_log_socket, "pycompat": check_pycompat}


def main(what: str, *args: str) -> None:
    import airflow

    plain = what not in WITH_ARGUMENTS
    result = {name: PLAIN[name]() for name in (what, *args)} if plain else WITH_ARGUMENTS[what](*args)
    result["airflow"] = airflow.__version__
    result["python"] = f"{sys.version_info[0]}.{sys.version_info[1]}"
    print("RELEASE-CHECK " + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
