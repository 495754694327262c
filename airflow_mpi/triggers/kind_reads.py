"""What the deferred trigger reads beyond the job's pods, as the waiting backend does, so both
decide alike (``kinds.base.JobKind``): the kind's top object while no pod exists (the job is queued,
or its controller refused it: its events say so), and, once, why the master pod was deleted
(an MPIJob's ``Failed`` condition, written a moment after the pod goes). Nothing is read for
the ``pods`` kind.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from airflow_mpi.backends.k8s_errors import NOT_FOUND, ApiSilence, api_status
from airflow_mpi.kinds.base import CONDITION_WAIT, JobKind
from airflow_mpi.observe.status import PodTable
from airflow_mpi.spec import Role


class KindReads:
    """The kind's view beyond the pods, as last read: ``top``, ``refusal``, ``master_gone_failure``."""

    def __init__(self, kind: JobKind, job_name: str, namespace: str, master: str, created_at: float | None) -> None:
        self.kind, self.job_name, self.namespace, self.master = kind, job_name, namespace, master
        self.created_at = created_at  # epoch seconds: how long the controller has been silent
        self.top: dict[str, Any] | None = None
        self.refusal: str | None = None  # why its controller will never start the job
        self.master_gone_failure: str | None = None
        self._master_gone_read = False

    async def read(self, table: PodTable, api_client: Any, silence: ApiSilence, since: float) -> None:
        """Read what ``table`` (the pods as watched) leaves the kind to learn, if anything."""
        kind = self.kind
        if not kind.controller_makes_pods():  # our Service says nothing the pods do not
            return
        pods = list(table.pods.values())
        master_gone = (
            kind.reads_top_when_master_deleted()
            and not self._master_gone_read
            and table.was_deleted(self.master, Role.MASTER)
        )
        if not (kind.reads_top_to_queue(pods) or master_gone):
            return
        from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

        group, version, plural, _ = kind.top_resource  # a controller's: only its kinds read the top
        custom = CustomObjectsApi(api_client)
        give_up = time.monotonic() + CONDITION_WAIT
        while True:
            try:
                self.top = await custom.get_namespaced_custom_object(
                    group,
                    version,
                    self.namespace,
                    plural,
                    self.job_name,
                    _request_timeout=silence.request_timeout(since),
                )
            except Exception as error:
                if api_status(error) != NOT_FOUND:
                    raise
                self.top = None
            silence.answered()
            if not master_gone:
                break
            failure = kind.master_gone_failure(self.top)
            if failure is not None or time.monotonic() >= give_up:
                self.master_gone_failure, self._master_gone_read = failure, True
                break
            await asyncio.sleep(0.2)
        selector = kind.events_selector(self.job_name, self.top) if not pods else None
        if selector is not None:
            events = await CoreV1Api(api_client).list_namespaced_event(
                self.namespace,
                field_selector=selector,
                _request_timeout=silence.request_timeout(since),
            )
            items = [api_client.sanitize_for_serialization(event) for event in events.items]
            self.refusal = kind.refusal(self.job_name, items, time.time() - (self.created_at or time.time()))
