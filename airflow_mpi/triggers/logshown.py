"""The deferred job's shown mark (``observe.shown``) on its ConfigMap: read when a trigger starts,
written before each record of the master's lines goes to the task log.

Written first, then the record: the mark never counts less than the log holds, so a trigger that
takes over never shows a line twice. A graceful stop (a triggerer told to stop, a trigger moved)
writes what it read and its mark, then ends: exactly once. A triggerer killed outright loses only
what it had marked and not yet handed to its supervisor: the record in flight, for the
milliseconds between the mark's write and the supervisor's read (docs/guides/deferred.md).

Each write is conditional on the ConfigMap's resourceVersion: a conflict means the object
changed, and if another trigger has marked it since, that trigger shows the lines from then on
and this one stops (``lost``). Without ``update`` on ConfigMaps, or without the ConfigMap, the
mark is off, with one warning: the lines are shown, and a takeover starts over from the
operator's count.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from typing import Any

from airflow_mpi.backends.k8s_errors import CONNECT_TIMEOUT, api_status
from airflow_mpi.observe.shown import SHOWN_ANNOTATION, ShownMark, parse_shown_mark
from airflow_mpi.triggers.api_client import raise_for_status

WRITE_TIMEOUT = 10.0  # seconds a mark's write may take before the mark is given up
CONFLICT = 409


def trigger_owner() -> str:
    """This trigger, among every triggerer's: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ShownLines:
    """The mark of one job's log, owned by one trigger."""

    def __init__(
        self, api_client: Any, namespace: str, config_map: str, try_number: int, *, timeout: float = WRITE_TIMEOUT
    ) -> None:
        self.api_client, self.namespace, self.config_map = api_client, namespace, config_map
        self.try_number = try_number
        # A read or write of the mark waits at most this (and never past the API's silence bound).
        self.request_timeout = (CONNECT_TIMEOUT, min(WRITE_TIMEOUT, timeout))
        self.log: Any = None  # the trigger's: where the one warning goes
        self.owner = trigger_owner()
        self.lines = 0  # what the mark says now
        self.lost = False  # another trigger marks this log now: show nothing more
        self.off = False  # the mark cannot be read or written here
        self._object: Any = None  # the ConfigMap as last read or written
        self._claimed = False  # our first write went through: a foreign owner since is a takeover

    async def claim(self, log: Any) -> int:
        """Read the mark and take it over; the lines it counts (0 without one). ``log``: the
        trigger's, for the one warning when the mark cannot be kept."""
        self.log = log
        try:
            self._object = await self._read()
        except Exception as error:
            self._give_up("read", error)
            return 0
        found = parse_shown_mark(self._object["metadata"].get("annotations"))
        self.lines = found.lines if found is not None else 0  # known even where it cannot be written
        await self.mark(self.lines)
        return self.lines

    async def mark(self, lines: int) -> bool:
        """Mark ``lines`` as in the log (before their record is written); False once another
        trigger owns the mark (``lost``). Off: True, nothing written."""
        if self.off:
            return True
        if self.lost:
            return False
        if self._claimed and lines <= self.lines:
            return True  # counted already (a warning after the lines it follows)
        for _ in range(5):  # conflicts with a writer that is not a trigger (a label added by hand)
            metadata = self._object["metadata"]
            found = parse_shown_mark(metadata.get("annotations"))
            if found is not None and found.owner != self.owner and self._claimed:
                self.lost = True
                return False
            if found is not None and not self._claimed:  # a claim: the newest count (the last
                lines = max(lines, found.lines)  # owner may have marked more since it was read)
            metadata["annotations"] = {
                **(metadata.get("annotations") or {}),
                SHOWN_ANNOTATION: ShownMark(lines, self.owner, self.try_number).render(),
            }
            try:
                self._object = await self._replace()
            except Exception as error:
                if api_status(error) != CONFLICT:
                    self._give_up("write", error)
                    return True
                try:
                    self._object = await self._read()
                except Exception as read_error:
                    self._give_up("read", read_error)
                    return True
                continue
            self._claimed = True
            self.lines = lines
            return True
        self._give_up("write", RuntimeError("the ConfigMap kept changing"))
        return True

    async def _read(self) -> dict[str, Any]:
        response = await self._core().read_namespaced_config_map(
            self.config_map, self.namespace, _preload_content=False, _request_timeout=self.request_timeout
        )
        return await _json(response)

    async def _replace(self) -> dict[str, Any]:
        """PUT the ConfigMap as read, its annotation changed: conditional on its resourceVersion."""
        response = await self._core().replace_namespaced_config_map(
            self.config_map,
            self.namespace,
            self._object,
            _preload_content=False,
            _request_timeout=self.request_timeout,
        )
        return await _json(response)

    def _core(self) -> Any:
        from kubernetes_asyncio.client import CoreV1Api

        return CoreV1Api(self.api_client)

    def _give_up(self, verb: str, error: BaseException) -> None:
        if isinstance(error, asyncio.CancelledError):
            raise error
        self.off = True
        self.log.warning(
            "airflow-mpi: cannot %s the live log's mark on ConfigMap %s/%s (%s): the lines are shown, but a "
            "triggerer that takes this trigger over would show them again from the start; allow get and "
            "update on configmaps (docs/guides/rbac.md)",
            verb,
            self.namespace,
            self.config_map,
            f"HTTP {api_status(error)}" if api_status(error) else type(error).__name__,
        )


async def _json(response: Any) -> dict[str, Any]:
    """The object of a raw (``_preload_content=False``) answer, or its error as ``ApiException``:
    the ConfigMap travels as the API gave it, never through the client's models (their times
    come back in another spelling)."""
    await raise_for_status(response)
    async with response:
        value: dict[str, Any] = json.loads(await response.read())
    return value
