"""Deferrable waits of MPIJobOperator on Kubernetes: until every worker is Ready, or until the job
ends, without holding a worker slot.

One watch over the job's pods (async client), driving the same ``WatchLoop`` and deciding with
the same ``evaluate_job`` as the synchronous backend: the trigger decides nothing of its own. Its
events are ``events.JobEvent``. ``serialize()`` returns primitives only. A user kill
(``on_kill``) deletes the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_mpi.backends.k8s_errors import GONE, api_status
from airflow_mpi.events import STATUS_FAILED, STATUS_TIMEOUT, WAIT_FINISHED, WAIT_READY, JobEvent, Outcome
from airflow_mpi.gang import describe_group_wait
from airflow_mpi.logstream import LineSplitter
from airflow_mpi.naming import job_selector
from airflow_mpi.readiness import probes_from_states, summarize_not_ready
from airflow_mpi.spec import Role
from airflow_mpi.status import JobPhase, PodTable, WatchLoop, evaluate_job

WATCH_SECONDS = 60


class MPIJobTrigger(BaseTrigger):
    """Fires once, a ``JobEvent``: status ``ready``, ``finished``, ``failed`` or ``timeout``."""

    def __init__(
        self,
        *,
        job_name: str,
        namespace: str,
        kubernetes_conn_id: str,
        wait_for: str,
        deadline: float,
        worker_pods: list[str],
        master_pod: str,
        timeout: float,
        ssh_port: int = 22,
        try_number: int = 1,
        marks: dict[str, float] | None = None,
        gang: bool = False,
        queue_deadline: float | None = None,
        custom_objects: list[list[str]] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.job_name = job_name
        self.namespace = namespace
        self.kubernetes_conn_id = kubernetes_conn_id
        self.wait_for = wait_for
        self.deadline = deadline  # epoch seconds
        self.worker_pods = list(worker_pods)
        self.master_pod = master_pod
        self.timeout = timeout  # what the deadline stands for, for the message
        self.ssh_port = ssh_port
        # Handed back in the event: the operator resumes as a new object that knows nothing.
        self.try_number = try_number
        self.marks = dict(marks or {})
        # A gang-scheduled job may wait for admission: its deadline moves on while it does,
        # and ``queue_deadline`` (scheduling.queue_timeout, epoch seconds) bounds that wait.
        self.gang = gang
        self.queue_deadline = queue_deadline
        # [group, version, plural] of custom objects named after the job, deleted on a kill.
        self.custom_objects = [list(kind) for kind in custom_objects or []]
        self._fired = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_name": self.job_name,
                "namespace": self.namespace,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "wait_for": self.wait_for,
                "deadline": self.deadline,
                "worker_pods": list(self.worker_pods),
                "master_pod": self.master_pod,
                "timeout": self.timeout,
                "ssh_port": self.ssh_port,
                "try_number": self.try_number,
                "marks": dict(self.marks),
                "gang": self.gang,
                "queue_deadline": self.queue_deadline,
                "custom_objects": [list(kind) for kind in self.custom_objects],
            },
        )

    @property
    def roles(self) -> dict[str, Role]:
        roles = dict.fromkeys(self.worker_pods, Role.WORKER)
        if self.wait_for == WAIT_FINISHED:
            roles[self.master_pod] = Role.MASTER
        return roles

    def decide(self, table: PodTable) -> Outcome | None:
        """The outcome to fire for the pods as they are now, or None to keep waiting."""
        if self.gang:
            queued = describe_group_wait(list(table.pods.values())) or (
                None if table.pods else "queued: the job's pods do not exist yet"
            )
            if queued is not None:
                now = time.time()
                if self.queue_deadline is not None and now >= self.queue_deadline:
                    return {"status": STATUS_TIMEOUT, "reason": f"waited past scheduling.queue_timeout: {queued}"}
                self.deadline = max(self.deadline, now + self.timeout)  # queued is not stuck
                return None
        states = table.states(self.roles)
        status = evaluate_job(states)
        if status.phase is JobPhase.FAILED:
            return {
                "status": STATUS_FAILED,
                "pod": status.failed_pod,
                "exit_code": status.exit_code,
                "reason": status.reason,
            }
        if self.wait_for == WAIT_READY and status.phase is JobPhase.READY:
            return {"status": WAIT_READY}
        if self.wait_for == WAIT_FINISHED and status.phase is JobPhase.SUCCEEDED:
            return {"status": WAIT_FINISHED}
        if time.time() >= self.deadline:
            if self.wait_for == WAIT_READY:
                probes = probes_from_states(self.job_name, states, self.roles)
                return {"status": STATUS_TIMEOUT, "reason": summarize_not_ready(probes, self.timeout, self.ssh_port)}
            return {"status": STATUS_TIMEOUT, "reason": f"the job ran past its timeout of {self.timeout:.0f}s"}
        return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
        from kubernetes_asyncio.client import CoreV1Api

        hook = AsyncKubernetesHook(conn_id=self.kubernetes_conn_id)
        loop = WatchLoop(first_backoff=0.2)
        selector = job_selector(self.job_name)
        async with hook.get_conn() as api_client:
            core = CoreV1Api(api_client)
            while True:
                try:
                    if loop.must_list:
                        listed = await core.list_namespaced_pod(self.namespace, label_selector=selector)
                        loop.listed(
                            [api_client.sanitize_for_serialization(p) for p in listed.items],
                            listed.metadata.resource_version,
                        )
                    outcome = self.decide(loop.table)
                    if outcome is not None:
                        yield self._fire(outcome)
                        return
                    wake = min(self.deadline, self.queue_deadline or self.deadline)
                    timeout = max(1, min(WATCH_SECONDS, int(wake - time.time()) + 1))
                    response: Any = await core.list_namespaced_pod(
                        self.namespace,
                        label_selector=selector,
                        watch=True,
                        resource_version=loop.table.resource_version,
                        allow_watch_bookmarks=True,
                        timeout_seconds=timeout,
                        _preload_content=False,
                    )
                    async with response, contextlib.aclosing(_watch_events(response)) as events:
                        async for event in events:
                            if not loop.apply(event):
                                break
                            outcome = self.decide(loop.table)
                            if outcome is not None:
                                yield self._fire(outcome)
                                return
                    loop.watch_ended()
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    self.log.warning("watching job %s: %s; retrying", self.job_name, error)
                    await asyncio.sleep(loop.failed(gone=api_status(error) == GONE))

    def _fire(self, outcome: Outcome) -> TriggerEvent:
        self._fired = True
        payload: JobEvent = {
            **outcome,
            "job_name": self.job_name,
            "wait_for": self.wait_for,
            "at": time.time(),
            "try_number": self.try_number,
            "marks": dict(self.marks),
        }
        return TriggerEvent(payload)  # type: ignore[no-untyped-call]

    async def on_kill(self) -> None:
        """The user killed the task while it was deferred: delete the job (Airflow 3.3+)."""
        if self._fired:
            return
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
        from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi, V1DeleteOptions

        async with AsyncKubernetesHook(conn_id=self.kubernetes_conn_id).get_conn() as api_client:
            for group, version, plural in self.custom_objects:
                with contextlib.suppress(Exception):
                    await CustomObjectsApi(api_client).delete_namespaced_custom_object(
                        group, version, self.namespace, plural, self.job_name, body=V1DeleteOptions()
                    )
            with contextlib.suppress(Exception):
                await CoreV1Api(api_client).delete_namespaced_service(
                    self.job_name, self.namespace, body=V1DeleteOptions(propagation_policy="Background")
                )
        self.log.info("task killed: MPI job %s deleted", self.job_name)


async def _watch_events(response: Any) -> AsyncGenerator[dict[str, Any], None]:
    """The events of a watch response (one JSON object a line; no cap: the API server bounds them)."""
    lines = LineSplitter(max_bytes=None)
    async for chunk in response.content.iter_any():
        for line in lines.feed(chunk):
            if line.strip():
                yield json.loads(line)
    for line in lines.flush():
        if line.strip():
            yield json.loads(line)
