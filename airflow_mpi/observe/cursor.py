"""A followed Kubernetes pod log (``timestamps=true``): its kubelet timestamps, where a stream
stopped (``LogCursor``), and the bytes after each stamp into a ``RankLineSplitter``, resumed after
a drop with no byte shown twice or lost (``TimestampedLogSplitter``). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from airflow_mpi import contract
from airflow_mpi.observe.lines import RankLineSplitter

MAX_STAMP_BYTES = 40  # "2026-11-29T20:00:01.123456789Z" and the space after it


def parse_log_timestamp(text: str) -> int:
    """Nanoseconds since the epoch from a kubelet timestamp (RFC3339Nano, e.g.
    ``2026-11-29T20:00:01.12345Z``). Full precision: Python's datetime keeps only microseconds."""
    main, _, rest = text.partition(".")
    fraction = rest.rstrip("Z") if rest else ""
    if not rest:
        main = main.rstrip("Z")
    return _epoch_seconds(main) * 1_000_000_000 + int((fraction + "000000000")[:9] or 0)


@lru_cache(maxsize=64)
def _epoch_seconds(text: str) -> int:
    """Whole seconds of a timestamp; cached: a busy log has thousands of lines per second."""
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp())


def format_since_time(ns: int) -> str:
    """``sinceTime`` for a resumed log stream: the API server keeps whole seconds anyway."""
    return datetime.fromtimestamp(ns // 1_000_000_000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class LogCursor:
    """Where a log stream stopped, by the node's own timestamps, so a resumed stream (which
    restarts at the whole second) emits every byte exactly once: lines before the last timestamp
    are replays, and so are the first ``count`` lines at it; of a line the stream broke off in,
    the first ``partial`` bytes were read already. No clock of this machine is used."""

    last_ns: int | None = None
    count: int = 0  # lines begun with timestamp == last_ns
    partial: int | None = None  # bytes read of the last line begun, while it is unfinished
    _replay_ns: int | None = None
    _replay_count: int = 0
    _replay_partial: int | None = None
    _replayed: int = 0

    def resume(self) -> str | None:
        """Call before (re)opening a stream; returns its ``sinceTime`` (None: from the start)."""
        self._replay_ns, self._replay_count, self._replayed = self.last_ns, self.count, 0
        self._replay_partial = self.partial
        return format_since_time(self.last_ns) if self.last_ns is not None else None

    def begin(self, ns: int) -> int | None:
        """A line with this timestamp starts: None if it was read in full before (skip it), else
        how many of its first bytes were read before (0 for a new line)."""
        if self._replay_ns is not None:
            if ns < self._replay_ns:
                return None
            if ns == self._replay_ns and self._replayed < self._replay_count:
                self._replayed += 1
                if self._replayed < self._replay_count or self._replay_partial is None:
                    return None
                self._replay_ns = None  # the line the last stream broke off in: go on inside it
                return self._replay_partial
            self._replay_ns = None  # past where the last stream stopped
        if ns == self.last_ns:
            self.count += 1
        else:
            self.last_ns, self.count = ns, 1
        self.partial = 0
        return 0

    @property
    def replaying(self) -> bool:
        """A resumed stream is still delivering what was read before."""
        return self._replay_ns is not None

    def took(self, ns: int, trailing: int, *, all_same: bool) -> None:
        """Whole lines were read at once, the last ``trailing`` of them stamped ``ns`` (all of
        them, when ``all_same``)."""
        if all_same and ns == self.last_ns:
            self.count += trailing
        else:
            self.last_ns, self.count = ns, trailing
        self.partial = None

    def advance(self, size: int) -> None:
        """``size`` more bytes of the current line were read."""
        if self.partial is not None:
            self.partial += size

    def end(self) -> None:
        """The current line ended (its newline was read)."""
        self.partial = None

    def accept(self, ns: int) -> bool:
        """A whole line at once: True if it is new (emit it), False if it is a replay."""
        if self.begin(ns) is None:
            return False
        self.end()
        return True

    def to_dict(self) -> dict[str, int]:
        partial = -1 if self.partial is None else self.partial
        return {"last_ns": self.last_ns or 0, "count": self.count, "partial": partial}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LogCursor:
        partial = int(data.get("partial", -1))
        return cls(
            last_ns=int(data["last_ns"]) or None, count=int(data["count"]), partial=None if partial < 0 else partial
        )


class TimestampedLogSplitter:
    """A followed ``timestamps=true`` pod log -> the lines of ``lines``. The kubelet stamps each
    line once, at its start, however long it grows; the bytes after the stamp go to ``lines`` as
    they arrive (a line that never ends costs no memory here), and the cursor skips whatever an
    earlier stream of the same log delivered, to the byte. One per stream: a new stream starts at
    a line's beginning (the cursor knows how much of that line was read)."""

    def __init__(self, cursor: LogCursor, lines: RankLineSplitter) -> None:
        self.cursor = cursor
        self.lines = lines
        self._stamp = bytearray()  # the timestamp being read, while ``_skip`` is unset
        self._in_line = False  # past the stamp of the current line
        self._skip: int | None = None  # bytes of this line still to drop; None: drop all (a replay)

    def feed(self, chunk: bytes) -> list[str]:
        body = bytearray()  # what is new, stamps removed: one feed of ``lines`` per chunk
        pos, size = 0, len(chunk)
        while pos < size:
            if not self._in_line and not self._stamp and not self.cursor.replaying:
                pos = self._whole_lines(chunk, pos, body)
                if pos == size:
                    break
            if not self._in_line:
                room = MAX_STAMP_BYTES - len(self._stamp)
                space = chunk.find(b" ", pos, pos + room)
                if space >= 0:
                    self._stamp += chunk[pos:space]
                    pos = space + 1
                    self._skip = self._begin(bytes(self._stamp))
                elif chunk.find(b"\n", pos, pos + room) < 0 and size - pos < room:
                    self._stamp += chunk[pos:]  # the stamp goes on in the next chunk
                    break
                else:
                    self._skip = None  # no stamp where one must be: the line is dropped
                self._stamp, self._in_line = bytearray(), True
            newline = chunk.find(b"\n", pos)
            end = size if newline < 0 else newline
            if self._skip is not None and end > pos:
                drop = min(self._skip, end - pos)
                self._skip -= drop
                body += chunk[pos + drop : end]
                self.cursor.advance(end - pos - drop)
            if newline < 0:
                break
            if self._skip is not None:
                body += b"\n"
                self.cursor.end()
            self._in_line, pos = False, newline + 1
        return self.lines.feed(bytes(body)) if body else []

    def _whole_lines(self, chunk: bytes, start: int, body: bytearray) -> int:
        """The fast path (no replay, at a line start): the whole lines from ``start`` into
        ``body`` at once, the cursor moved past them. Returns where the rest of the chunk starts."""
        end = chunk.rfind(b"\n", start) + 1
        if not end:
            return start
        parts = [line.partition(b" ") for line in chunk[start : end - 1].split(b"\n")]
        last = parts[-1][0]
        try:
            ns = parse_log_timestamp(last.decode("ascii"))
        except ValueError:
            return start  # an odd line: the careful path drops it
        trailing = 1
        while trailing < len(parts) and parts[-1 - trailing][0] == last:
            trailing += 1
        self.cursor.took(ns, trailing, all_same=trailing == len(parts))
        body += b"\n".join(part[2] for part in parts)
        body += b"\n"
        return end

    def _begin(self, stamp: bytes) -> int | None:
        try:
            ns = parse_log_timestamp(stamp.decode("ascii"))
        except ValueError:
            return None  # not a stamped line (should not happen with timestamps=true): dropped
        return self.cursor.begin(ns)


def split_timestamped(line: str) -> tuple[int, str]:
    """``"<RFC3339Nano> text"`` (a ``timestamps=true`` log line) -> (ns, text)."""
    stamp, _, text = line.partition(" ")
    return parse_log_timestamp(stamp), text


def followed_log_call(namespace: str, pod: str, since: str | None) -> tuple[str, dict[str, Any]]:
    """The path and ``call_api`` arguments (both Kubernetes clients, sync and async, take the
    same) of a pod's log followed with a stamp on every line, from ``since`` (the cursor's
    RFC 3339 resume point) when given; the caller adds its ``_request_timeout``."""
    query = [("container", contract.CONTAINER_NAME), ("follow", "true"), ("timestamps", "true")]
    if since:
        query.append(("sinceTime", since))  # the clients have no since_time parameter
    return f"/api/v1/namespaces/{namespace}/pods/{pod}/log", {
        "query_params": query,
        "header_params": {"Accept": "*/*"},
        "auth_settings": ["BearerToken"],
        "_return_http_data_only": True,
        "_preload_content": False,
    }
