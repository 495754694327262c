"""One watch over a job's pods, in a thread, for the waiting backend: the shared ``WatchLoop``
(list, watch from the resourceVersion, relist on 410 Gone, back off) kept in a ``PodTable`` that
waiters read under ``cond`` and wake on. The deferred trigger drives the same ``WatchLoop`` on
its event loop instead (``triggers.mpi``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from airflow_mpi.backends.k8s_errors import GONE, ApiRequest, ApiSilence, api_status, is_refusal, translate
from airflow_mpi.backends.token_file import renewed_since, token_generation
from airflow_mpi.exceptions import BackendError
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.observe.cursor import LogCursor
from airflow_mpi.observe.lines import LineSplitter, RankLineSplitter
from airflow_mpi.observe.status import PodTable, WatchLoop
from airflow_mpi.spec import Role

WATCH_SECONDS = 290  # the API server ends a watch by itself after at most ~5-10 minutes
Obj = dict[str, Any]


class PodWatcher:
    """One watch over a job's pods in a thread, kept in a ``PodTable``; waiters wake on events.
    The thread drives the shared ``WatchLoop`` (list, watch, relist on 410, back off) until it is
    stopped, the API refuses (401, 403, 404 ...), or the API has been silent for the bound; then
    ``check`` raises why, so no waiter waits on a watch that has ended."""

    def __init__(self, core: Any, namespace: str, selector: str, silence: ApiSilence) -> None:
        self.core, self.namespace, self.selector = core, namespace, selector
        self.silence = silence
        self.loop = WatchLoop(first_backoff=0.1)
        self.cond = threading.Condition()
        self.error: BackendError | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self._listed = False
        self._since = time.monotonic()

    @property
    def table(self) -> PodTable:
        return self.loop.table

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, resource_version: str) -> None:
        self.table.resource_version = resource_version
        self._since = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.selector}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise what ended the watch, or ``BackendUnreachable`` once the API has been silent
        for the bound (even while a request of the thread still hangs)."""
        if self.error is not None:
            raise self.error
        if self.silence.exceeded(self._since):
            raise self.silence.error(self._since)

    def wait(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait(timeout)

    def wait_listed(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self._listed and self.error is None and time.monotonic() < deadline:
                if self.silence.exceeded(self._since):
                    return
                self.cond.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()
        if self._thread is not None:
            self._thread.join(5)

    def _list(self) -> None:
        response = self.core.list_namespaced_pod(
            self.namespace,
            label_selector=self.selector,
            _preload_content=False,
            _request_timeout=self.silence.request_timeout(self._since),
        )
        data = json.loads(response.data)
        self.silence.answered()
        with self.cond:
            self.loop.listed(data.get("items") or [], data["metadata"]["resourceVersion"])
            self._listed = True
            self.cond.notify_all()

    def _watch(self) -> Any:
        # A quiet watch must still end (and so answer) well within the bound.
        seconds = self.silence.watch_seconds(WATCH_SECONDS)
        return self.core.list_namespaced_pod(
            self.namespace,
            label_selector=self.selector,
            watch=True,
            resource_version=self.table.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _preload_content=False,
            _request_timeout=self.silence.request_timeout(self._since, read=seconds + self.silence.limit / 2),
        )

    def _run(self) -> None:
        loop = self.loop
        while not self._stop.is_set():
            verb = "list"  # the RBAC verb of the request under way, for a refusal's message
            token = token_generation(self.core.api_client)
            try:
                if loop.must_list:
                    self._list()
                else:
                    with self.cond:
                        self._listed = True
                        self.cond.notify_all()
                verb = "watch"
                self._response = self._watch()
                self.silence.answered()
                for event in _watch_events(self._response):
                    self.silence.answered()
                    with self.cond:
                        current = loop.apply(event)
                        self.cond.notify_all()
                    if not current:
                        break
                loop.watch_ended()
            except Exception as error:
                if self._stop.is_set():
                    break
                self.silence.failed(error)
                if is_refusal(error) and not renewed_since(self.core.api_client, token):
                    self._end(translate(error, ApiRequest(verb, "pods", self.namespace), self.silence.api_url))
                    break
                if self.silence.exceeded(self._since):
                    self._end(self.silence.error(self._since))
                    break
                delay = loop.failed(gone=api_status(error) == GONE)
                self._stop.wait(min(delay, max(0.05, self.silence.left(self._since))))
            finally:
                response, self._response = self._response, None
                if response is not None:
                    with contextlib.suppress(Exception):
                        response.release_conn()
        with self.cond:
            self.cond.notify_all()

    def _end(self, error: BackendError) -> None:
        with self.cond:
            self.error = error
            self.cond.notify_all()


def _watch_events(response: Any) -> Iterator[Obj]:
    """The events of a watch response (one JSON object a line; no cap: the API server bounds them)."""
    lines = LineSplitter(max_bytes=None)
    for chunk in response.stream(65536, decode_content=False):
        yield from (json.loads(line) for line in lines.feed(chunk) if line.strip())
    yield from (json.loads(line) for line in lines.flush() if line.strip())


@dataclass
class WatchedJob:
    """A job the backend watches: its pods' watch, who is who, and its master log's cursor."""

    name: str
    namespace: str
    watcher: PodWatcher
    roles: dict[str, Role]  # worker pods, and the master once it is created
    master: str
    plan: JobPlan | None = None
    cursor: LogCursor = field(default_factory=LogCursor)
    # The master's output across reconnects: each rank's unfinished line survives a dropped stream.
    lines: RankLineSplitter = field(default_factory=RankLineSplitter)
    final_pods: list[str] = field(default_factory=list)
    seen_events: int = -1  # the watch's event count when pod states were last read
    created_at: float = field(default_factory=time.monotonic)
    # Why the master pod was deleted, as the top object said (once read: it does not change).
    gone_failure: tuple[str | None] | None = None
