"""Airflow's own processes (api-server, dag-processor, scheduler, triggerer; LocalExecutor) on a
fresh home and SQLite database, for the tests that need what only they do: the task log's
endpoint while a task is deferred, a killed triggerer, the UI in a browser. Ended only by PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.airflow_rest import AirflowREST

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Airflow:
    """Airflow's processes on a fresh home; ends them (and only them) by PID."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.api = f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}"
        self.users: dict[str, str] = {}  # user -> password, where the simple auth manager asks for them

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``env``: variables over the processes' own (e.g. a log folder of this one's)."""
        out = open(self.home / f"{name}.out", "ab")  # noqa: SIM115 (the process keeps it)
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow", *args], env={**self.env, **(env or {})}, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL a process and its children (a triggerer runs its triggers in a child)."""
        proc = self.procs.pop(name)
        for pid in [*descendants(proc.pid), proc.pid]:
            with_missing(lambda pid=pid: os.kill(pid, signal.SIGKILL))
        proc.wait(10)

    def pause(self, name: str) -> list[int]:
        """SIGSTOP a process and its children: alive but silent, as a triggerer whose heartbeat
        comes late (a stalled node, a long GC). Returns the PIDs, for ``resume``."""
        pids = [self.procs[name].pid, *descendants(self.procs[name].pid)]
        for pid in pids:
            with_missing(lambda pid=pid: os.kill(pid, signal.SIGSTOP))
        return pids

    def resume(self, pids: list[int]) -> None:
        for pid in pids:
            with_missing(lambda pid=pid: os.kill(pid, signal.SIGCONT))

    def stop(self) -> None:
        for name, proc in list(self.procs.items()):
            pids = [*descendants(proc.pid), proc.pid]
            self.resume(pids)  # a paused one too
            with_missing(lambda proc=proc: proc.terminate())
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
            for pid in pids:
                with_missing(lambda pid=pid: os.kill(pid, signal.SIGKILL))
            with_missing(lambda proc=proc: proc.wait(5))
            del self.procs[name]

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.api + path, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.api + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            self.api + path, data=data, method="PATCH", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def rest(self, user: str | None = None) -> AirflowREST:
        """The public API's client, logged in as ``user`` (any user the processes were given when
        None) or, where every caller is an admin, anonymous."""
        name = user or next(iter(self.users), None)
        return AirflowREST(self.api, name, self.users[name] if name else None)

    def tail(self, name: str, size: int = 3000) -> str:
        path = self.home / f"{name}.out"
        return path.read_bytes()[-size:].decode("utf-8", "replace") if path.exists() else ""


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *descendants(child)]
    return found


def with_missing(call: Any) -> None:
    try:
        call()
    except (ProcessLookupError, subprocess.TimeoutExpired, OSError):
        pass


def wait_for(
    what: str, check: Any, timeout: float, airflow: Airflow, on_timeout: Callable[[str], object] | None = None
) -> Any:
    """``check()`` until it is truthy; on timeout the Airflow processes' logs say why
    (``on_timeout(what)`` first keeps what else shows it, e.g. a screenshot)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
        except Exception:
            got = None
        if got:
            return got
        time.sleep(0.5)
    if on_timeout is not None:
        on_timeout(what)
    logs = "\n".join(f"--- {name}\n{airflow.tail(name)}" for name in ("scheduler", "triggerer", "api-server"))
    raise AssertionError(f"{what}: not within {timeout}s\n{logs}")


@contextmanager
def airflow_processes(
    home: Path, dags: dict[str, str], *, env: dict[str, str] | None = None, users: dict[str, str] | None = None,
    **settings: str,
) -> Iterator[Airflow]:  # fmt: skip
    """Airflow's processes on ``home`` with ``dags`` (file name -> source) in its DAG folder;
    ``env``: more variables (connections); ``users``: admins of the simple auth manager (name ->
    password), who must log in (without them every caller is an admin); ``settings``: more
    ``AIRFLOW__...`` variables."""
    (home / "dags").mkdir(parents=True, exist_ok=True)
    for name, source in dags.items():
        (home / "dags" / name).parent.mkdir(parents=True, exist_ok=True)
        (home / "dags" / name).write_text(source)
    extra = env or {}
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW__")}
    env.update(extra)
    env.update(
        AIRFLOW_HOME=str(home),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__PARALLELISM="4",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
        AIRFLOW__API__PORT=str(free_port()),
        AIRFLOW__API__SECRET_KEY="airflow-processes-test",
        AIRFLOW__API_AUTH__JWT_SECRET="airflow-processes-test-jwt-secret-0123456789",
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
        AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="5",
        AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
        AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="1",
        AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="4",
    )
    if users:
        passwords = home / "simple_auth_manager_passwords.json"
        passwords.write_text(json.dumps(users))
        env.update(
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="False",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=",".join(f"{name}:admin" for name in users),
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
        )
    env.update(settings)  # over the defaults above
    env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://127.0.0.1:{env['AIRFLOW__API__PORT']}/execution/"
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
    processes = Airflow(home, env)
    processes.users = dict(users or {})
    try:
        processes.start("api-server", "api-server", "--port", env["AIRFLOW__API__PORT"])
        processes.start("dag-processor", "dag-processor")
        processes.start("scheduler", "scheduler")
        processes.start("triggerer", "triggerer")
        yield processes
    finally:
        processes.stop()
