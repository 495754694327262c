"""The deferred job's shown mark (``observe.shown``) on the job's Lease: read when a trigger
starts, written before the records of the master's lines it counts go to the task log.

Written first, then the records: the mark never counts less than the log holds, so a trigger
that takes over never shows a line twice. At most one write a second (``WRITE_INTERVAL``): the
records that arrive meanwhile wait, and one write counts them all. A graceful stop (a triggerer
told to stop, a trigger moved) writes what it read and its mark, then ends: exactly once. A
triggerer killed outright loses only what it had marked and not yet handed to its supervisor
(docs/guides/deferred.md).

Each write is conditional on the Lease's resourceVersion. A trigger that finds another trigger
holding the mark (Airflow's handover: both run the trigger for a while) gives way (``lost``): it
drops the records the holder counts, and keeps the others. A live trigger of this job counts the
lines as the log gets them; a holder that has not counted a line this trigger read
``LEASE_SECONDS`` ago is none, and neither is a holder that is no trigger at all: this trigger
says so once and takes the mark back. A mark it cannot believe is said once too, and hides
nothing. Without the Lease, or without ``get``/``update`` on Leases, the mark is off, with one
warning: the lines are shown, and a takeover starts over from the operator's count.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from airflow_mpi.backends.k8s_errors import CONNECT_TIMEOUT, api_status
from airflow_mpi.kinds.manifests import LOG_LEASE
from airflow_mpi.observe.shown import (
    LEASE_SECONDS,
    ShownMark,
    build_trigger_owner,
    is_trigger_owner,
    parse_lease_mark,
    render_lease_mark,
)
from airflow_mpi.triggers.api_client import raise_for_status

WRITE_TIMEOUT = 10.0  # seconds a mark's read or write may take before the mark is given up
WRITE_INTERVAL = 1.0  # seconds between two writes of one job's mark, at least
CONFLICT = 409


def trigger_owner() -> str:
    """This trigger, among every triggerer's: host, process and a random part."""
    return build_trigger_owner(socket.gethostname(), os.getpid(), uuid.uuid4().hex)


def micro_time(now: float) -> str:
    """A Lease's time (MicroTime: RFC 3339 with microseconds)."""
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ShownLines:
    """The mark of one job's log, held by one trigger."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        lease: str,
        try_number: int,
        *,
        timeout: float = WRITE_TIMEOUT,
        write_interval: float = WRITE_INTERVAL,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self.api_client, self.namespace, self.lease = api_client, namespace, lease
        self.try_number = try_number
        # A read or write of the mark waits at most this (and never past the API's silence bound).
        self.request_timeout = (CONNECT_TIMEOUT, min(WRITE_TIMEOUT, timeout))
        self.write_interval, self.lease_seconds = write_interval, lease_seconds
        self.log: Any = None  # the trigger's: where the reports go
        self.owner = trigger_owner()
        self.lines = 0  # what the mark says now (another holder's count, while ``lost``)
        self.lost = False  # another trigger holds the mark now: show only what it does not count
        self.off = False  # the mark cannot be read or written here
        self.writes = 0  # the Lease's writes by this trigger
        self._object: dict[str, Any] = {}  # the Lease as last read or written
        self._claimed = False  # our first write went through: a foreign holder since is a takeover
        self._written_at = float("-inf")  # monotonic: the last read or write, for the pace
        self._reported: set[str] = set()

    async def claim(self, log: Any) -> int:
        """Read the mark and take it over; the lines it counts (0 without one, or with one not
        believed: said once in ``log``, the trigger's)."""
        self.log = log
        if not await self._reread():
            return 0
        found = parse_lease_mark(self._object)
        if found.problem is not None:
            self.report(f"the mark on Lease {self.namespace}/{self.lease} is not believed: {found.problem}")
        self.lines = found.mark.lines if found.mark is not None else 0  # known even where it cannot be written
        await self.mark(self.lines)
        return self.lines

    def distrust(self, why: str, lines: int) -> None:
        """The claimed count is not to be believed (``why``: said once): count ``lines`` instead."""
        self.report(f"the mark on Lease {self.namespace}/{self.lease} is not believed: {why}")
        self.lines = lines

    async def pace(self) -> None:
        """Until a write is due (``write_interval`` after the last one)."""
        wait = self._written_at + self.write_interval - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def mark(self, lines: int, *, read_at: float | None = None, stopping: bool = False) -> bool:
        """Mark ``lines`` as in the log (before their records are written): True to write them.
        False while another trigger holds the mark (``lost``): the records ``lines`` counts are
        then its to show (``holder_counts``), unless the oldest of them, read at ``read_at``
        (monotonic), is older than ``lease_seconds`` and still not counted: the mark is then taken
        back. ``stopping``: the trigger is cancelled, it looks no further. Off: True, nothing written."""
        if self.off:
            return True
        if self.lost:
            return await self._beside_holder(lines, read_at, stopping)
        if self._claimed and lines <= self.lines:
            return True  # counted already (a warning after the lines it follows)
        return await self._write(lines)

    def holder_counts(self, lines: int) -> bool:
        """Whether the holder of the mark (another trigger, while ``lost``) counts ``lines``."""
        return self.lost and lines <= self.lines

    def report(self, text: str) -> None:
        """Once per text, in the task log (a tampered mark is said, not repeated every write)."""
        if text not in self._reported and self.log is not None:
            self._reported.add(text)
            self.log.warning("airflow-mpi: %s; every line is shown from this trigger's own count", text)

    async def _write(self, lines: int) -> bool:
        for _ in range(5):  # conflicts: another writer between our read and our write
            found = parse_lease_mark(self._object)
            if self._claimed and found.holder != self.owner:
                if is_trigger_owner(found.holder):  # a takeover: it shows the lines it counts
                    self.lost = True
                    self.lines = found.mark.lines if found.mark is not None else 0
                    return False
                self.report(
                    f"the mark on Lease {self.namespace}/{self.lease} names {found.holder!r:.60}, which is not "
                    "an airflow-mpi trigger"
                )
            if not self._claimed and found.mark is not None:  # a claim: the newest believed count
                lines = max(lines, found.mark.lines)  # (the last holder may have marked more since)
            mark = ShownMark(lines, self.owner, self.try_number)
            body = render_lease_mark(self._object, mark, micro_time(time.time()))
            try:
                self._object = await self._replace(body)
            except Exception as error:
                if api_status(error) != CONFLICT:
                    self._give_up("write", error)
                    return True
                if not await self._reread():
                    return True
                continue
            self.writes += 1
            self._written_at = time.monotonic()
            self._claimed = True
            self.lines = lines
            return True
        self._give_up("write", RuntimeError("the Lease kept changing"))
        return True

    async def _beside_holder(self, lines: int, read_at: float | None, stopping: bool) -> bool:
        """Another trigger holds the mark: read its count (at the writes' pace); take the mark
        back when the holder is no trigger, or has not counted a line read ``lease_seconds`` ago."""
        if stopping:  # no time to look: as last read (a takeover cancels this trigger next)
            if lines > self.lines and self._overdue(read_at) is not None:
                return await self._take_back(lines, read_at)
            return False
        if not await self._reread():
            return True
        self._written_at = time.monotonic()
        found = parse_lease_mark(self._object)
        if found.holder == self.owner or not is_trigger_owner(found.holder):
            self.lost = False  # given back, or written over by what is no trigger: ours again
            return await self._write(lines)
        self.lines = found.mark.lines if found.mark is not None else 0
        if lines <= self.lines:
            return False  # it counts them: its to show
        return self._overdue(read_at) is not None and await self._take_back(lines, read_at)

    def _overdue(self, read_at: float | None) -> float | None:
        """Seconds since the oldest line the holder does not count was read, once past ``lease_seconds``."""
        waited = time.monotonic() - read_at if read_at is not None else 0.0
        return waited if waited >= self.lease_seconds else None

    async def _take_back(self, lines: int, read_at: float | None) -> bool:
        holder = parse_lease_mark(self._object).holder
        self.report(
            f"the mark on Lease {self.namespace}/{self.lease} is held by {holder!r:.60}, which has not counted "
            f"lines this trigger read {self.lease_seconds:.0f} s ago: no live trigger of this job"
        )
        self.lost = False
        return await self._write(lines)

    async def _reread(self) -> bool:
        """Read the Lease again into ``_object``; False once the mark is given up (it cannot be read)."""
        try:
            self._object = await self._read()
        except Exception as error:
            self._give_up("read", error)
            return False
        return True

    async def _read(self) -> dict[str, Any]:
        group, version, plural, _ = LOG_LEASE
        response = await self._custom().get_namespaced_custom_object(
            group, version, self.namespace, plural, self.lease, _preload_content=False,
            _request_timeout=self.request_timeout,
        )  # fmt: skip
        return await _json(response)

    async def _replace(self, body: dict[str, Any]) -> dict[str, Any]:
        """PUT the Lease as read, its mark changed: conditional on its resourceVersion."""
        group, version, plural, _ = LOG_LEASE
        response = await self._custom().replace_namespaced_custom_object(
            group, version, self.namespace, plural, self.lease, body, _preload_content=False,
            _request_timeout=self.request_timeout,
        )  # fmt: skip
        return await _json(response)

    def _custom(self) -> Any:
        from kubernetes_asyncio.client import CustomObjectsApi

        return CustomObjectsApi(self.api_client)

    def _give_up(self, verb: str, error: BaseException) -> None:
        if isinstance(error, asyncio.CancelledError):
            raise error
        self.off = True
        if self.log is None:
            return
        self.log.warning(
            "airflow-mpi: cannot %s the live log's mark on Lease %s/%s (%s): the lines are shown, but a "
            "triggerer that takes this trigger over would show them again from the start; allow get and "
            "update on leases (coordination.k8s.io) to the triggerer (docs/guides/rbac.md)",
            verb,
            self.namespace,
            self.lease,
            f"HTTP {api_status(error)}" if api_status(error) else type(error).__name__,
        )


async def _json(response: Any) -> dict[str, Any]:
    """The object of a raw (``_preload_content=False``) answer, or its error as ``ApiException``:
    the Lease travels as the API gave it, never through the client's models (their times come
    back in another spelling)."""
    await raise_for_status(response)
    async with response:
        value: dict[str, Any] = json.loads(await response.read())
    return value
