"""``ControllerKind``: the base of the kinds whose job is one custom object of a controller's
(Volcano's Job, mpi-operator's MPIJob, Trainer's TrainJob), which makes the pods from it.

What they share: the top object goes first and last (our Secret and ConfigMap are its
dependents), a job without pods waits as its top object says, the controller's events or silence
say it never starts, and its leftovers are its pods and whatever else it made. MPIJob and
TrainJob also share their master: a batch Job's pod named ``<master>-<random>`` (the newest
counts), whose top object's ``Failed`` condition says why it went, and once it ended by itself
the controller removes the workers still running.
"""

from __future__ import annotations

from typing import ClassVar

from airflow_mpi.job.naming import job_selector
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.base import (
    CONTROLLER_GRACE,
    NOT_QUEUED,
    JobKind,
    Leftover,
    Obj,
    QueueCheck,
    top_condition,
)
from airflow_mpi.kinds.gang import describe_group_wait
from airflow_mpi.kinds.manifests import owner_reference_to
from airflow_mpi.observe.status import PodState
from airflow_mpi.spec import Role


class ControllerKind(JobKind):
    """A job that is a controller's custom object (``top_resource``)."""

    # The event the controller refuses a job with (it sets no condition then); None: it never does.
    _refusal_event: ClassVar[str | None] = None
    _refused_by: ClassVar[str] = ""  # who refuses, as the refusal says it: "mpi-operator refused"
    # Refusals the controller retries by itself (a cache behind the API): not final within the grace.
    _retried_refusals: ClassVar[tuple[str, ...]] = ()
    # What a controller silent for over ``CONTROLLER_GRACE`` means: ``{job}``, ``{waited}`` (seconds).
    _silence: ClassVar[str] = ""

    def controller_makes_pods(self) -> bool:
        return True

    def owner_reference(self, plan: JobPlan, uid: str) -> Obj:
        """The top object owns our Secret and ConfigMap: deleting it garbage-collects them."""
        return owner_reference_to(self.top_resource, plan.job_name, uid)

    def owns(self, obj: Obj) -> bool:
        refs = obj.get("metadata", {}).get("ownerReferences") or []
        return any((ref.get("apiVersion"), ref.get("kind")) == self._top_owner for ref in refs)

    def reads_top_to_queue(self, pods: list[Obj]) -> bool:
        """Before the controller made any pod, only its top object says why."""
        return not pods

    def events_selector(self, job_name: str, top: Obj | None) -> str | None:
        """The events about the top object, while the controller has left it without a word."""
        if self._refusal_event is None or not self._silent(top):
            return None
        return f"involvedObject.name={job_name},involvedObject.kind={self.top_resource[3]}"

    def refusal(self, job_name: str, events: list[Obj], waited: float) -> str | None:
        """The controller's refusal event, or its silence past ``CONTROLLER_GRACE``: it is not
        installed, not running, or not watching this namespace."""
        if self._refusal_event is None:
            return None
        refused = event_message(events, self._refusal_event)
        retried = refused is not None and any(text in refused for text in self._retried_refusals)
        if refused is not None and (not retried or waited > CONTROLLER_GRACE):
            return f"{self._refused_by} {self.top_label} {job_name} ({self._refusal_event}): {refused}"
        if waited > CONTROLLER_GRACE:
            return self._silence.format(job=job_name, waited=waited)
        return None

    def reads_top_when_master_deleted(self) -> bool:
        return self._master_generated

    def master_gone_failure(self, top: Obj | None) -> str | None:
        """A generated master's top object's ``Failed`` condition (its deadline, a worker's Job failed)."""
        failed = top_condition(top, "Failed") if self._master_generated else None
        if failed is None:
            return None
        reason, message = failed.get("reason") or "Failed", failed.get("message") or ""
        return f"{self.top_label} failed: {reason}" + (f": {message}" if message else "")

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        """The top object: the rest goes with it."""
        return [self.top_resource[:3]]

    def leftovers(self, job_name: str) -> list[Leftover]:
        """The job's pods, by the controller's label."""
        return [Leftover("pods", selector=self._pods_selector(job_name))]

    # --- hooks ----------------------------------------------------------------------------

    @property
    def _top_owner(self) -> tuple[str, str]:
        """(apiVersion, kind) of the top object, as an owner reference names it."""
        group, version, _, kind = self.top_resource
        return (f"{group}/{version}", kind)

    def _pods_selector(self, job_name: str) -> str:
        """The label selector of every pod of the job."""
        return job_selector(job_name)

    def _silent(self, top: Obj | None) -> bool:
        """Whether the controller has said nothing of the top object yet (no condition)."""
        return top is not None and not (top.get("status") or {}).get("conditions")

    def _top_wait(self, top: Obj | None) -> str | None:
        """Why the job has no pods yet, as its top object says (suspended in a queue, not yet
        seen by the controller ...); None: it does not wait."""
        return None

    def _queue_check(self, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None) -> QueueCheck:
        """Without pods yet: as the top object says (or never, when it failed already); once
        there are pods, a gang's say so (unschedulable or gated, none scheduled)."""
        if not pods:
            failure = self.master_gone_failure(top)
            return QueueCheck(failure=failure) if failure is not None else QueueCheck(reason=self._top_wait(top))
        if not gang:
            return NOT_QUEUED
        return QueueCheck(reason=describe_group_wait(pods, queue))

    def _observe(self, states: list[PodState], deleting: set[str]) -> list[PodState]:
        """Without the workers the controller removes once the master ended by itself."""
        return without_cleanup_kills(states, deleting)


def event_message(events: list[Obj], reason: str) -> str | None:
    """The message of the first event with ``reason`` (a controller that refuses an object may
    say so only in an event: no condition), or None."""
    for event in events:
        if event.get("reason") == reason:
            return str(event.get("message") or reason)
    return None


def without_cleanup_kills(states: list[PodState], deleting: set[str]) -> list[PodState]:
    """Pod states without the workers a controller removes once the master has ended by itself
    (mpi-operator's ``cleanPodPolicy: Running``, JobSet's deletion of the Jobs still active): they
    are not what decided the job (an evicted or failed worker is kept)."""
    master = next((state for state in states if state.role is Role.MASTER), None)
    if master is None or not master.ended or master.reason == "Deleted":
        return states
    return [
        state
        for state in states
        if state.role is Role.MASTER or (state.name not in deleting and state.reason != "Deleted")
    ]
