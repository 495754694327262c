"""Deferrable waits of MPIJobOperator on Kubernetes: until the job ends, without holding a worker
slot. The operator defers once, with the master started beside its workers (its launch script
waits for their sshd); the trigger bounds the workers' start by ``startup_timeout`` and, while
it waits for the end, follows the master's log into the task try's log, live (``logfollow``):
Airflow routes a trigger's log records to the log of the task try that deferred.

One watch over the job's pods (async client), driving the same ``WatchLoop`` and deciding with
the same ``evaluate_job`` as the synchronous backend: the trigger decides nothing of its own. Its
events are ``events.Outcome`` values with an envelope. ``serialize()`` returns primitives only. A user kill
(``on_kill``) deletes the job; a trigger handed to another triggerer leaves it (``task_state``).

The wait always ends: at the deadline whatever the API does (every request runs under it), at
once when the API refuses (401, 403, 404 ...: what to change), and once the API has not answered
for ``api_timeout`` seconds (connection refused, no reply, only 5xx).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_mpi import events
from airflow_mpi.backends.k8s_errors import (
    CONNECT_TIMEOUT,
    GONE,
    ApiRequest,
    ApiSilence,
    api_status,
    explain,
    is_refusal,
)
from airflow_mpi.backends.removal import job_deletions
from airflow_mpi.backends.token_file import renewed_since, token_generation
from airflow_mpi.events import Envelope, Outcome, WaitContract
from airflow_mpi.job.mpirun import TIMEOUT_GRACE
from airflow_mpi.job.naming import job_selector
from airflow_mpi.kinds.manifests import log_lease_name
from airflow_mpi.kinds.registry import job_kind
from airflow_mpi.observe.master_output import MasterOutput, OutputPlan
from airflow_mpi.observe.output import TAIL_LINES
from airflow_mpi.observe.queueing import QueueClock
from airflow_mpi.observe.readiness import probes_from_states, ready_since, summarize_not_ready
from airflow_mpi.observe.status import JobPhase, PodState, PodTable, WatchLoop, evaluate_job
from airflow_mpi.spec import Role
from airflow_mpi.triggers.api_client import import_client, raise_for_status, shared_api_client, watch_events
from airflow_mpi.triggers.kind_reads import KindReads
from airflow_mpi.triggers.logwriter import MasterRecords
from airflow_mpi.triggers.task_state import job_still_the_tasks
from airflow_mpi.triggers.timeouts import timeout_after

WATCH_SECONDS = 60
KILL_TIMEOUT = 30.0  # seconds on_kill waits for the API to accept the delete
TAIL_LINE_CHARS = 4096  # of each of the master's last lines in the event
DRAIN_TIMEOUT = 30.0  # seconds the log may take to end once the master has (the operator shows the rest)
STOP_MARK_TIMEOUT = 5.0  # seconds a cancelled trigger may take to mark the lines it writes last
_KILLS: set[asyncio.Future[None]] = set()  # on_kill's work under way (the loop holds tasks weakly)


class MPIJobTrigger(BaseTrigger):
    """Fires once, an event whose ``outcome`` says what ended the wait (``events.Outcome``)."""

    def __init__(self, contract: Mapping[str, Any]) -> None:
        """``contract``: a ``WaitContract.to_dict()``, what the operator defers with."""
        super().__init__()  # type: ignore[no-untyped-call]
        wait = WaitContract.from_dict(contract)
        self.contract = wait  # read where it is needed; only the deadlines below move
        self.job_name, self.namespace = wait.job_name, wait.namespace  # in every request and message
        self.deadline = wait.deadline  # epoch seconds; moves on while the job is queued
        # The job kind (``kinds``): the same functions read its pods as the waiting backend's.
        self.kind = job_kind(wait.kind)
        # A job may wait for admission (a gang, a queue): the deadline moves on while it does,
        # and scheduling.queue_timeout bounds the total wait (``queueing``: the one rule).
        self.queue_clock = QueueClock(wait.queue_timeout, start=wait.created_at)
        self._watch_loop = WatchLoop(first_backoff=0.2)  # the pods as the watch sees them
        self.beyond_pods = KindReads(self.kind, wait.job_name, wait.namespace, wait.master_pod, wait.created_at)
        # Waiting for the end of a job whose master started with its workers: every worker must
        # be Ready (sshd answering its readiness probe) within ``startup_timeout``, as the waiting
        # path's sensor requires. Counted from this trigger's start (a trigger started again by
        # another triggerer gives the workers the whole bound again: never a wrong kill); it
        # moves on while the job is queued, and is lifted once every worker was Ready.
        self.startup_deadline = time.time() + wait.startup_timeout if wait.startup_timeout else None
        self._fired = False
        self._master_ended: asyncio.Event | None = None
        self._records: MasterRecords | None = None  # the master's lines into the task log

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {"contract": self.contract.to_dict()}

    @property
    def roles(self) -> dict[str, Role]:
        roles = dict.fromkeys(self.contract.worker_pods, Role.WORKER)
        roles[self.contract.master_pod] = Role.MASTER
        return roles

    def decide(self, table: PodTable) -> Outcome | None:
        """The outcome to fire for the pods as they are now (and what ``_read_top`` read of the
        kind's top object), or None to keep waiting: the waiting path's rules, through the kind."""
        now = time.time()
        seen, contract = self.beyond_pods, self.contract
        pods = list(table.pods.values())
        kind = self.kind
        admission = kind.admission(self.job_name, contract.gang, contract.queue, pods, seen.top, lambda: seen.refusal)
        if admission.never_starts is not None:
            return events.never_starts(admission.never_starts)
        queued = admission.queued
        self.queue_clock.observe(queued, now)
        if queued is not None:
            note = self.queue_clock.note(self.job_name, queued, now)
            if note is not None:
                self.log.info("%s", note)
            if self.queue_clock.expired(now):
                return events.queue_timeout(self.queue_clock.timeout_message(self.job_name, queued, now))
            self.deadline = max(self.deadline, now + self.contract.timeout)  # queued is not stuck
            if self.startup_deadline is not None and self.contract.startup_timeout:
                self.startup_deadline = max(self.startup_deadline, now + self.contract.startup_timeout)
            return None
        deleting = {name for name, pod in table.pods.items() if pod["metadata"].get("deletionTimestamp")}
        states = kind.deciding_states(
            self.contract.master_pod, table.states(self.roles), deleting, seen.master_gone_failure
        )
        if self._master_ended is not None and any(s.role is Role.MASTER and s.ended for s in states):
            self._master_ended.set()  # the log follow may stop at the end of its stream
        status = evaluate_job(states)
        if status.phase is JobPhase.FAILED:
            starting = self.startup_deadline is not None  # before every worker was Ready
            return events.pod_failed(status.failed_pod, status.exit_code, status.reason, starting=starting)
        not_started = self._still_starting(states, now, table)
        if not_started is not None:
            return not_started
        if status.phase is JobPhase.SUCCEEDED:
            return events.finished()
        if time.time() >= self.deadline + TIMEOUT_GRACE:  # mpiexec's own --timeout reports first
            return events.job_timeout(f"the job ran past its timeout of {self.contract.timeout:.0f}s")
        return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await import_client()  # in a thread, not on the loop the other triggers share
        from kubernetes_asyncio.client import CoreV1Api

        async with shared_api_client(self.contract.kubernetes_conn_id) as api_client:
            refused = await self._refused_permissions(api_client)
            if refused is not None:
                yield self._fire(refused)
                return
            if self.contract.master_log is not None:
                try:
                    outcome = await self._wait_following(CoreV1Api(api_client), api_client)
                    if self._records is not None and outcome["outcome"] == events.API_UNREACHABLE:
                        self._records.write_now()  # no mark to wait for: the API does not answer
                    elif self._records is not None:  # the resumed task counts them shown: in the log first
                        await self._records.written(DRAIN_TIMEOUT)
                except BaseException:  # cancelled (stopped, moved): what was read goes in, marked
                    if self._records is not None:
                        await self._records.stop(STOP_MARK_TIMEOUT)
                    raise
            else:
                outcome = await self._wait(CoreV1Api(api_client), api_client)
        yield self._fire(outcome)

    async def _refused_permissions(self, api_client: Any) -> Outcome | None:
        """What the triggerer's credentials lack of its Role for this job, checked once before
        it follows the job (``triggers.rules_review``): ``api_refused`` naming it; ``api_unreachable``
        when the API stayed silent for the whole ``api_timeout`` (the wait would only start its
        own clock again); None: nothing missing, the server cannot tell, or the deadline is first."""
        from airflow_mpi.triggers.rules_review import refused_permissions

        needed = self.kind.trigger_permissions(self.contract.custom_objects)
        # Bounded by the wait's next bound too (the startup bound, the deadline, the queue's):
        # one that comes first is the wait's to fire, whatever the API does meanwhile.
        limit = max(0.0, min(self.contract.api_timeout, self._wake() - time.time()))
        since = time.monotonic()
        try:
            async with timeout_after(limit):
                refused = await refused_permissions(
                    api_client, self.namespace, needed, (CONNECT_TIMEOUT, limit + 1), self.contract.kubernetes_conn_id
                )
        except TimeoutError:
            if limit < self.contract.api_timeout:
                return None
            silence = ApiSilence(str(api_client.configuration.host), self.contract.api_timeout)
            silence.last_answer = since
            return events.api_unreachable(str(silence.error(since)))
        return None if refused is None else events.api_refused(refused)

    async def _wait_following(self, core: Any, api_client: Any) -> Outcome:
        """The pod watch and the master's log follow side by side. The job's end fires once the
        log has ended too (every line shown first, within ``DRAIN_TIMEOUT``); a failing world-size
        check fires at once; any other outcome (a worker failed, the deadline) fires at once."""
        from airflow_mpi.triggers.logfollow import MasterLogFollower, budget_for_loop
        from airflow_mpi.triggers.logshown import ShownLines

        assert self.contract.master_log is not None
        view = OutputPlan.from_dict(self.contract.master_log)
        mark = ShownLines(
            api_client,
            self.namespace,
            log_lease_name(self.job_name),
            self.contract.try_number,
            timeout=self.contract.api_timeout,
        )
        records = self._records = MasterRecords(lambda: output.lines_read, shown=mark)
        output = MasterOutput(view, records.info, records.warning, skip_lines=self.contract.skip_lines)
        self._master_ended = asyncio.Event()
        follower = MasterLogFollower(
            api_client,
            self.namespace,
            view.master,
            output,
            self._master_ended,
            budget=budget_for_loop().for_job(),
            caught_up=records.caught_up,
            log=self.log,
            pod=self._master_pod_now,
        )
        following = asyncio.create_task(self._claim_then_follow(mark, follower), name=f"log-{view.master}")
        watching = asyncio.create_task(self._wait(core, api_client), name=f"watch-{self.job_name}")
        try:
            done, _ = await asyncio.wait({following, watching}, return_when=asyncio.FIRST_COMPLETED)
            if following in done:
                following.result()
                if follower.refused is not None:
                    return events.api_refused(follower.refused)
                if follower.failure is not None:
                    return events.rank_failed(follower.failure, output.lines_read)
                if follower.hang is not None:
                    return events.hung(follower.hang, output.lines_read)
                outcome = await watching  # the log ended with the master: the watch says how
            else:
                outcome = watching.result()
                if self._master_ended.is_set() and outcome["outcome"] in (events.FINISHED, events.POD_FAILED):
                    with contextlib.suppress(TimeoutError):
                        async with timeout_after(DRAIN_TIMEOUT):
                            await asyncio.shield(following)
                    if follower.failure is not None:
                        return events.rank_failed(follower.failure, output.lines_read)
            outcome["log_lines"] = output.lines_read
            outcome["tail"] = last_lines(output.output.tail)
            return outcome
        finally:
            for task in (following, watching):
                task.cancel()
            await asyncio.gather(following, watching, return_exceptions=True)

    async def _claim_then_follow(self, mark: Any, follower: Any) -> None:
        """Take the job's mark over (beside the pod watch: an API that does not answer is the
        watch's to bound), then follow the log after the lines the mark counts. A count beyond
        the operator's is checked against the log: more lines than it holds is no trigger's
        count, and the log is shown from the operator's."""
        from airflow_mpi.triggers.logfollow import count_log_lines

        given = follower.output.skip_lines
        shown = await mark.claim(self.log)
        if shown > given:
            pod = follower.pod()
            while pod is None and not self._master_ended_set():
                await asyncio.sleep(0.2)
                pod = follower.pod()
            held, why = 0, ""
            if pod is not None:
                try:
                    held = await count_log_lines(
                        follower.api_client, self.namespace, pod, shown, self.contract.api_timeout
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # never believed unchecked: a line twice, never one hidden
                    why = f" (it could not be read: {type(error).__name__})"
            if held < shown:
                mark.distrust(f"it counts {shown} line(s), but the master's log holds {held}{why}", given)
                shown = given
        if shown > given:
            follower.output.skip_lines = shown
            self.log.info(
                "airflow-mpi: the job's mark says %d line(s) of %s are shown: going on after them",
                shown,
                follower.master,
            )
        await follower.run()

    async def _wait(self, core: Any, api_client: Any) -> Outcome:
        """Watch until the pods decide, the deadline passes, the API refuses, or the API has not
        answered for ``api_timeout`` seconds; each round runs under whichever comes first."""
        silence = ApiSilence(str(api_client.configuration.host), self.contract.api_timeout)
        since = time.monotonic()
        loop = self._watch_loop
        selector = job_selector(self.job_name)
        verb = "list"

        async def watch_round() -> Outcome | None:
            nonlocal verb
            if loop.must_list:
                verb = "list"
                listed = await core.list_namespaced_pod(
                    self.namespace, label_selector=selector, _request_timeout=silence.request_timeout(since)
                )
                silence.answered()
                loop.listed(
                    [api_client.sanitize_for_serialization(p) for p in listed.items], listed.metadata.resource_version
                )
                gone = self._vanished(loop.table)
                if gone is not None:
                    return gone
            await self.beyond_pods.read(loop.table, api_client, silence, since)
            outcome = self.decide(loop.table)
            if outcome is not None:
                return outcome
            verb = "watch"
            seconds = min(silence.watch_seconds(WATCH_SECONDS), max(1, int(self._wake() - time.time()) + 1))
            response: Any = await core.list_namespaced_pod(
                self.namespace,
                label_selector=selector,
                watch=True,
                resource_version=loop.table.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _preload_content=False,
                _request_timeout=silence.request_timeout(since, read=seconds + silence.limit / 2),
            )
            await raise_for_status(response)
            silence.answered()
            async with response, contextlib.aclosing(watch_events(response)) as events:
                async for event in events:
                    silence.answered()
                    if not loop.apply(event):
                        break
                    await self.beyond_pods.read(loop.table, api_client, silence, since)
                    outcome = self.decide(loop.table)
                    if outcome is not None:
                        return outcome
            silence.answered()  # the watch ran its course
            loop.watch_ended()
            return None

        while True:
            if silence.exceeded(since):
                return events.api_unreachable(str(silence.error(since)))
            outcome = self.decide(loop.table)  # the deadline fires here, whatever the API did
            if outcome is not None:
                return outcome
            bound = timeout_after(max(0.0, min(self._wake() - time.time(), silence.left(since))))
            token = token_generation(api_client)
            try:
                async with bound:
                    outcome = await watch_round()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if bound.expired():
                    continue  # the top of the loop says which bound it was
                silence.failed(error)
                if is_refusal(error) and not renewed_since(api_client, token):
                    request = ApiRequest(verb, "pods", self.namespace)
                    return events.api_refused(explain(error, request, silence.api_url))
                self.log.warning("watching job %s: %s; retrying", self.job_name, error)
                delay = loop.failed(gone=api_status(error) == GONE)
                await asyncio.sleep(min(delay, max(0.05, silence.left(since)), max(0.05, self._wake() - time.time())))
                continue
            if outcome is not None:
                return outcome

    def _still_starting(self, states: list[PodState], now: float, table: PodTable) -> Outcome | None:
        """The startup bound of a job whose master started with its workers: once every worker
        is Ready it is lifted, and the job's timeout counts from then (mpiexec starts then, and
        the waiting path counts from mpiexec's start); past it, the workers not Ready are named,
        as the sensor names them."""
        if self.startup_deadline is None:
            return None
        probes = probes_from_states(self.job_name, states, self.roles)
        if all(probe.ok for probe in probes):
            self.startup_deadline = None
            workers = [table.pods[name] for name in self.contract.worker_pods if name in table.pods]
            started = ready_since(workers) or now
            self.deadline = max(self.deadline, started + self.contract.timeout)
            return None
        if now < self.startup_deadline:
            return None
        return events.startup_timeout(
            summarize_not_ready(probes, float(self.contract.startup_timeout or 0), self.contract.ssh_port)
        )

    def _master_ended_set(self) -> bool:
        return self._master_ended is not None and self._master_ended.is_set()

    def _master_pod_now(self) -> str | None:
        return self.kind.master_pod_now(self._watch_loop.table, self.contract.master_pod)

    def _wake(self) -> float:
        """When ``decide`` must look again whatever the API does: the deadline, or the end of
        the allowed queue wait when it comes first (the deadline moves on while queued)."""
        clock = self.queue_clock
        deadline = self.deadline + TIMEOUT_GRACE
        wake = deadline if self.startup_deadline is None else min(deadline, self.startup_deadline)
        if clock.limit is None or clock.since is None:
            return wake
        return min(wake, clock.since + clock.limit - clock.waited)

    def _vanished(self, table: PodTable) -> Outcome | None:
        """After a list: every pod waited for was created before the deferral, so one that is not
        there was deleted; none there at all means the job, or its namespace, is gone. Not so for
        a kind with a controller: it creates the pods, some of them after the deferral (a batch
        Job's launcher pod comes a moment after the workers), so one not there yet is pending, and
        the startup bound and the deadline in ``decide`` bound that wait."""
        if self.kind.controller_makes_pods():
            return None
        pods = list(table.pods.values())
        gang, queue = self.contract.gang, self.contract.queue
        if gang and (
            not pods or self.kind.admission(self.job_name, gang, queue, pods, self.beyond_pods.top, lambda: None).queued
        ):
            return None  # a queued job's pods may not exist yet: ``decide`` bounds that wait
        missing = [name for name in self.roles if name not in table.pods]
        if missing and len(missing) == len(self.roles):
            return events.api_refused(
                f"no pod of MPI job {self.job_name} is left in namespace {self.namespace}: the job was deleted, "
                "or its namespace was (a namespace that does not exist lists no pods)"
            )
        table.deleted.update(missing)
        return None

    def _fire(self, outcome: Outcome) -> TriggerEvent:
        self._fired = True
        envelope: Envelope = {
            "job_name": self.job_name,
            "at": time.time(),
            "try_number": self.contract.try_number,
            "marks": dict(self.contract.marks),
        }
        return TriggerEvent(events.fire(outcome, envelope))  # type: ignore[no-untyped-call]

    async def on_kill(self) -> None:
        """The user killed the task while it was deferred: delete the job (Airflow 3.3+). Airflow
        calls this too when it hands the trigger to another triggerer (this one's heartbeat came
        late): the task is still deferred then (or already resumed by the other copy), and the
        job is left to it. Shielded: Airflow cancels the trigger again at each turn of its loop
        (about a second) until it ends, on_kill included, and the work must end all the same."""
        if self._fired:
            return
        work = asyncio.ensure_future(self._delete_unless_still_the_tasks())
        _KILLS.add(work)
        work.add_done_callback(_KILLS.discard)
        await asyncio.shield(work)

    async def _delete_unless_still_the_tasks(self) -> None:
        left, state = await job_still_the_tasks(self.task_instance)
        if left:
            self.log.info(
                "this triggerer no longer runs the trigger, and the task is %s (deferred on another triggerer, "
                "or resumed): MPI job %s left to it",
                state,
                self.job_name,
            )
            return
        await import_client()
        from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi, V1DeleteOptions

        timeout = (CONNECT_TIMEOUT, KILL_TIMEOUT)
        async with shared_api_client(self.contract.kubernetes_conn_id) as api_client:
            for (group, version, plural), propagation in job_deletions(self.kind, list(self.contract.custom_objects)):
                body = V1DeleteOptions(propagation_policy=propagation)
                with contextlib.suppress(Exception):  # not there, or refused: the task's failure says the rest
                    if plural == "services" and not group:
                        await CoreV1Api(api_client).delete_namespaced_service(
                            self.job_name, self.namespace, body=body, _request_timeout=timeout
                        )
                    else:
                        await CustomObjectsApi(api_client).delete_namespaced_custom_object(
                            group, version, self.namespace, plural, self.job_name, body=body, _request_timeout=timeout
                        )
        self.log.info("task killed (its state: %s): MPI job %s deleted", state, self.job_name)


def last_lines(tail: list[str]) -> list[str]:
    """The master's last lines for the event: the resumed task's failure message quotes them
    when the master pod (its log) is gone by then. Bounded: the event is stored."""
    return [line[:TAIL_LINE_CHARS] for line in tail[-TAIL_LINES:]]
