"""A client for Airflow 3's public REST API, as a user's script or CI drives a deployment: a token
from the simple auth manager, unpause, trigger with conf, a run's and a task's state, a task try's
log followed with continuation tokens (JSON and NDJSON forms), XCom, extra links, import errors.
Shapes as Airflow 3.3's ``airflow/api_fastapi/core_api/routes/public`` serves them. Stdlib only.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

FINISHED_RUN = frozenset({"success", "failed"})
# A task instance's states after which nothing more happens to the try (retries make a new one).
FINISHED_TASK = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
JSON = "application/json"
READ_TRIES = 3  # a GET answered 5xx is asked this many times in all, READ_RETRY_AFTER seconds apart
READ_RETRY_AFTER = 2.0
NDJSON = "application/x-ndjson"


class RESTError(AssertionError):
    """An answer other than the one asked for: the method, path, status and Airflow's detail."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:2000]}")
        self.status, self.body = status, body


@dataclass
class LogFollow:
    """One task try's log read poll after poll: each ``poll()`` gives only the lines that arrived
    since the last one. The JSON form resumes from the continuation token Airflow hands back
    (which holds the position; none once the try's log is complete). The NDJSON form's token does
    not (Airflow 3.3 drops the position from it and sends it before reading, complete or not): each
    read is the whole log so far, so the lines past those already given are the new ones, and the
    log is complete when the try had finished before the read. The sources group that heads every
    read is given once, by the first."""

    client: AirflowREST
    dag_id: str
    run_id: str
    task_id: str
    try_number: int
    form: str = JSON
    map_index: int = -1
    token: str | None = None
    ended: bool = False
    seen: int = 0  # records already given (the NDJSON form)
    polls: list[list[str]] = field(default_factory=list)  # the new lines of each poll

    def poll(self) -> list[str]:
        if self.form == NDJSON:
            ti = self.client.task_instance(self.dag_id, self.run_id, self.task_id, self.map_index)
            finished = ti.get("try_number") != self.try_number or ti.get("state") in FINISHED_TASK
            records, _ = self.client.log_records(
                self.dag_id, self.run_id, self.task_id, self.try_number, form=NDJSON, map_index=self.map_index
            )
            # The group naming the log's sources comes first and changes (a running try's log is
            # served by its worker too): the position counts the records after it.
            body = without_sources(records)
            head = [] if self.polls else records[: len(records) - len(body)]
            records, self.seen, self.ended = head + body[self.seen :], max(self.seen, len(body)), finished
        else:
            records, self.token = self.client.log_records(
                self.dag_id, self.run_id, self.task_id, self.try_number,
                token=self.token, map_index=self.map_index,
            )  # fmt: skip
            self.ended = self.token is None
        lines = [record_text(record) for record in records]
        self.polls.append(lines)
        return lines

    def lines(self, every: float = 2.0, timeout: float = 1800) -> Iterator[str]:
        """Every line, as it arrives, until the try's log ends (or ``timeout`` seconds pass)."""
        deadline = time.monotonic() + timeout
        while not self.ended:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.dag_id}.{self.task_id} try {self.try_number}: log not ended in {timeout}s")
            yield from self.poll()
            if not self.ended:
                time.sleep(every)


class AirflowREST:
    """Airflow's public API at ``url`` (``http://host:port``); with ``user`` and ``password`` it
    logs in through the simple auth manager (``POST /auth/token``) and again when a token expires;
    without them it calls as the anonymous admin (``simple_auth_manager_all_admins``)."""

    def __init__(self, url: str, user: str | None = None, password: str | None = None, timeout: float = 30) -> None:
        self.url, self.user, self.password, self.timeout = url.rstrip("/"), user, password, timeout
        self._token: str | None = None
        self.failed_reads: list[str] = []  # the 5xx answers to reads that were asked again

    # ---- transport ---------------------------------------------------------------------------

    def login(self) -> str:
        """``POST /auth/token`` {"username", "password"} -> 201 {"access_token"}."""
        status, _, body = self._send(
            "POST", "/auth/token", {"username": self.user, "password": self.password}, auth=False
        )
        if status != 201:
            raise RESTError("POST", "/auth/token", status, body.decode(errors="replace"))
        self._token = str(json.loads(body)["access_token"])
        return self._token

    def request(
        self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None, accept: str = JSON
    ) -> tuple[dict[str, str], bytes]:
        """One call; a 401 with credentials logs in once more and repeats it. A read the server
        failed (5xx: under load its database connection can drop mid-request) is asked again, as a
        user's script would, up to ``READ_TRIES`` times; a write is not (it may have happened).
        Anything but 2xx then raises."""
        if params:
            path += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        for attempt in range(1, READ_TRIES + 1):
            status, headers, data = self._send(method, path, body, accept=accept)
            if status == 401 and self.user is not None:
                self.login()
                status, headers, data = self._send(method, path, body, accept=accept)
            if method != "GET" or status < 500 or attempt == READ_TRIES:
                break
            self.failed_reads.append(f"GET {path}: HTTP {status}: {data[:300].decode(errors='replace')}")
            time.sleep(READ_RETRY_AFTER)
        if not 200 <= status < 300:
            raise RESTError(method, path, status, data.decode(errors="replace"))
        return headers, data

    def get(self, path: str, **params: Any) -> Any:
        return json.loads(self.request("GET", path, params=params)[1])

    def post(self, path: str, body: Any) -> Any:
        return json.loads(self.request("POST", path, body)[1])

    def patch(self, path: str, body: Any) -> Any:
        return json.loads(self.request("PATCH", path, body)[1])

    def _send(
        self, method: str, path: str, body: Any = None, *, accept: str = JSON, auth: bool = True
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = JSON
        if auth and self.user is not None:
            headers["Authorization"] = f"Bearer {self._token or self.login()}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, dict(response.headers.items()), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers.items()), error.read()

    # ---- DAGs and runs -----------------------------------------------------------------------

    def dag(self, dag_id: str) -> dict[str, Any]:
        return dict(self.get(f"/api/v2/dags/{q(dag_id)}"))

    def unpause(self, dag_id: str) -> dict[str, Any]:
        return dict(self.patch(f"/api/v2/dags/{q(dag_id)}", {"is_paused": False}))

    def trigger(
        self, dag_id: str, conf: Mapping[str, Any] | None = None, *, run_id: str | None = None,
        logical_date: str | None = None,
    ) -> str:  # fmt: skip
        """A manual run of ``dag_id`` with ``conf`` (the DAG's params); its run id.
        ``logical_date`` None: a run with no logical date, as Airflow 3's UI triggers."""
        body: dict[str, Any] = {"logical_date": logical_date, "conf": dict(conf or {})}
        if run_id is not None:
            body["dag_run_id"] = run_id
        return str(self.post(f"/api/v2/dags/{q(dag_id)}/dagRuns", body)["dag_run_id"])

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.get(f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}"))

    def task_instance(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        path = f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}"
        return dict(self.get(path if map_index < 0 else f"{path}/{map_index}"))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        found = self.get(f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in found}

    def wait_run(self, dag_id: str, run_id: str, timeout: float, every: float = 3.0) -> str:
        """The run's state once it has finished."""
        state = wait_until(
            f"run {dag_id}/{run_id} finished", lambda: self.run(dag_id, run_id)["state"], FINISHED_RUN, timeout, every
        )
        return str(state)

    def wait_task(
        self, dag_id: str, run_id: str, task_id: str, states: frozenset[str] | set[str], timeout: float,
        every: float = 2.0,
    ) -> dict[str, Any]:  # fmt: skip
        """The task instance once its state is one of ``states``."""
        found: dict[str, Any] = {}

        def state() -> str | None:
            found.update(self.task_instance(dag_id, run_id, task_id))
            return found.get("state")

        wait_until(f"{dag_id}/{run_id}/{task_id} in {sorted(states)}", state, states, timeout, every)
        return found

    # ---- what a task left ----------------------------------------------------------------------

    def log_records(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, *, token: str | None = None,
        form: str = JSON, map_index: int = -1, full_content: bool = False,
    ) -> tuple[list[dict[str, Any]], str | None]:  # fmt: skip
        """One read of a try's log from where ``token`` left off: its records and the token for the
        next read (None once the log is complete). ``form``: JSON (``continuation_token`` in the
        body) or NDJSON (one record a line; the ``Airflow-Continuation-Token`` header: see
        ``LogFollow`` for what it does not hold)."""
        path = f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}/logs/{try_number}"
        params = {"full_content": str(full_content).lower(), "map_index": map_index, "token": token}
        headers, data = self.request("GET", path, params=params, accept=form)
        if form == NDJSON:
            records = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
            lowered = {k.lower(): v for k, v in headers.items()}
            return records, lowered.get("airflow-continuation-token")
        body = json.loads(data)
        content = body["content"]
        # An older log handler's answer is text; Airflow 3's is a list of records.
        records = content if isinstance(content, list) else [{"event": line} for line in str(content).splitlines()]
        return records, body.get("continuation_token")

    def log_text(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> str:
        """A try's whole log as Airflow merges it now (worker, triggerers), one record a line."""
        records, _ = self.log_records(dag_id, run_id, task_id, try_number, map_index=map_index, full_content=True)
        return "\n".join(record_text(record) for record in records)

    def follow_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, form: str = JSON) -> LogFollow:
        return LogFollow(self, dag_id, run_id, task_id, try_number, form=form)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """An XCom's value, decoded (the API returns what the database holds, often JSON text)."""
        path = f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}/xcomEntries/{q(key)}"
        value = self.get(path, map_index=map_index)["value"]
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value

    def extra_links(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, str | None]:
        """The task's links as its Details tab shows them: name -> URL (None: no button)."""
        path = f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}/links"
        return dict(self.get(path, map_index=map_index)["extra_links"])

    def import_errors(self) -> dict[str, str]:
        """The DAG files that failed to import: file name -> stack trace."""
        found = self.get("/api/v2/importErrors", limit=100)["import_errors"]
        return {error["filename"]: error["stack_trace"] for error in found}


def without_sources(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records after the leading "Log message source details" group."""
    if records and str(records[0].get("event", "")).startswith("::group::Log message source"):
        ends = [i for i, record in enumerate(records) if record.get("event") == "::endgroup::"]
        return records[ends[0] + 1 :] if ends else records
    return records


def record_text(record: Mapping[str, Any]) -> str:
    """A structured log record as text: its ``event`` (what was said), and for a failure the
    exception Airflow keeps beside it (``error_detail``: type and message, no frames)."""
    text = str(record.get("event", ""))
    for error in record.get("error_detail") or []:
        if isinstance(error, Mapping):
            text += f"\n{error.get('exc_type', '')}: {error.get('exc_value', '')}"
    return text


def q(part: str) -> str:
    """A path segment (run ids hold ``:`` and ``+``)."""
    return urllib.parse.quote(part, safe="")


def wait_until(
    what: str, read: Callable[[], Any], wanted: frozenset[str] | set[str], timeout: float, every: float
) -> Any:
    """``read()`` until its answer is in ``wanted``; a timeout says the last answer."""
    deadline, last = time.monotonic() + timeout, None
    while True:
        try:
            last = read()
        except (OSError, RESTError) as error:  # a restarting api-server: ask again
            last = f"error: {error}"
        if last in wanted:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s (last: {last})")
        time.sleep(every)
