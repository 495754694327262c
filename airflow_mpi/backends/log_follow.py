"""The master's log, live, for the waiting backend: one followed stream, resumed after a drop or a
quiet read timeout from the last line's own timestamp and byte offset (``LogCursor``), so no
line is shown twice or lost whatever the clock skew; cut lines and ``\\r`` progress bars go on
where they stopped (``RankLineSplitter``). The deferred trigger follows the same way on its event
loop (``triggers.logfollow``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from airflow_mpi.backends.k8s_errors import BAD_REQUEST, NOT_FOUND, ApiRequest, ApiSilence, api_status, is_transient
from airflow_mpi.backends.k8s_errors import translate as translate_error
from airflow_mpi.backends.pod_watch import WatchedJob
from airflow_mpi.backends.token_file import renewed_since, token_generation
from airflow_mpi.observe.cursor import TimestampedLogSplitter
from airflow_mpi.observe.status import PodPhase, PodState

EOF = object()
CLEAN_END_WAIT = 2.0  # seconds a cleanly ended stream waits for the watch to show the master's end
# A pod that cannot start shows it in its waiting reason: its log will never open.
NEVER_STARTS = ("Err", "Image", "Invalid")


class MasterLogFollow:
    """Follows one job's master log. ``master_state()`` reads the master's state from the watch
    (raising when the watch ended); ``open_log(since)`` opens the stream (``since``: the cursor's
    RFC 3339 resume point, or None)."""

    def __init__(
        self,
        job: WatchedJob,
        master_state: Callable[[], PodState],
        open_log: Callable[[str | None], Any],
        silence: ApiSilence,
    ) -> None:
        self.job, self.master_state, self.open_log, self.silence = job, master_state, open_log, silence

    def batches(self, idle_tick: float) -> Iterator[list[str]]:
        """Batches of new lines (``[]`` every ``idle_tick`` when none came: the caller's turn),
        until the master has ended and its stream ended cleanly, or the pod is gone."""
        job, reconnects = self.job, 0
        while True:
            state = self.master_state()
            if state.phase is PodPhase.PENDING and not state.reason.startswith(NEVER_STARTS):
                job.watcher.wait(idle_tick)
                yield []
                continue
            if state.reason == "Deleted":
                return
            client = getattr(job.watcher.core, "api_client", None)
            token = token_generation(client)
            try:
                response = self.open_log(job.cursor.resume())
                self.silence.answered()
            except Exception as error:
                self.silence.failed(error)
                status = api_status(error)
                if status == NOT_FOUND or (state.ended and status == BAD_REQUEST):
                    return  # gone, or ended without ever starting (e.g. an image error)
                if status == BAD_REQUEST or is_transient(error) or renewed_since(client, token):
                    # 400: the container is not up yet. A transient failure is bounded by the
                    # watch: master_state raises once the API has been silent for api_timeout.
                    job.watcher.wait(min(0.2 * (reconnects + 1), 2.0))
                    reconnects += 1
                    yield []
                    continue
                request = ApiRequest("get", "pods/log", job.namespace, job.master)
                raise translate_error(error, request, self.silence.api_url) from error
            clean = yield from self._read_stream(response, idle_tick)
            if clean and self._ended_soon():
                return
            reconnects += 1
            job.watcher.wait(0.05)
            # The runner's turn: a stream that keeps ending at once (a node that lost the
            # container while its pod says Running) must not keep its timeout from running.
            yield []

    def _ended_soon(self) -> bool:
        """Whether the master ended, after a stream that ended cleanly: that is what the end of a
        followed log means, and the watch tells it a moment later (more than 0.2 s on a loaded
        machine, when the stream used to be opened again for nothing). Waits for the watch up to
        ``CLEAN_END_WAIT``; a stream the server closed on a running container (its own time
        limit) opens again after that, from the cursor, so no line is lost."""
        deadline = time.monotonic() + CLEAN_END_WAIT
        while not (ended := self.master_state().ended) and (left := deadline - time.monotonic()) > 0:
            self.job.watcher.wait(min(left, 0.2))  # wakes at the watch's next event
        return ended

    def _read_stream(self, response: Any, idle_tick: float) -> Generator[list[str], None, bool]:
        """Yield batches of new lines; returns True on a clean end of stream, False on a drop."""
        job = self.job
        chunks: queue.Queue[Any] = queue.Queue(maxsize=64)  # bounded: ~4 MB in flight at most

        def read() -> None:
            try:
                for chunk in response.stream(65536, decode_content=False):
                    chunks.put(chunk)
                chunks.put(EOF)
            except Exception as error:
                chunks.put(error)

        reader = threading.Thread(target=read, name=f"log-{job.master}", daemon=True)
        reader.start()
        # Bytes after each line's stamp go on to the job's splitter as they come: a line that
        # never ends (a progress bar) costs no memory, and a resumed stream skips, to the byte,
        # what the cursor says was read (a line broken off by a drop goes on where it stopped).
        stream = TimestampedLogSplitter(job.cursor, job.lines)
        clean = False
        try:
            while True:
                try:
                    item = chunks.get(timeout=idle_tick)
                except queue.Empty:
                    yield []
                    continue
                # A kubelet sends a line per HTTP chunk: what has arrived meanwhile goes in one
                # batch, so the caller's per-batch work is paid per read, not per line.
                data, end = take_queued(chunks, item)
                if data:
                    batch: list[str] = stream.feed(data)
                    batch += job.lines.progress()
                    if batch:
                        yield batch
                if end is EOF:
                    clean = True
                    break
                if end is not None:
                    break
        finally:
            with contextlib.suppress(Exception):
                response.shutdown()
            with contextlib.suppress(Exception):
                response.release_conn()
            reader.join(2)
        return clean


def take_queued(chunks: queue.Queue[Any], first: Any, limit: int = 1 << 20) -> tuple[bytes, Any]:
    """``first`` and the chunks already queued behind it, up to ``limit`` bytes, joined; and the
    end met on the way (EOF or the reader's exception), or None."""
    pieces: list[bytes] = []
    size, item = 0, first
    while True:
        if item is EOF or isinstance(item, Exception):
            return b"".join(pieces), item
        pieces.append(item)
        size += len(item)
        if size >= limit:
            return b"".join(pieces), None
        try:
            item = chunks.get_nowait()
        except queue.Empty:
            return b"".join(pieces), None
