"""One state machine for a job: pod states -> job phase and, when it failed, the cause.

The operator, the sensor and the triggers all decide through ``evaluate_job``; backends only
report what each pod is doing (``PodState``). Kubernetes pods become ``PodState`` here too
(``pod_state_from_k8s``), ``PodTable`` applies watch events and ``WatchLoop`` decides when to
list, watch or back off, for the sync backend and the async trigger alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from airflow_mpi.job.naming import LABEL_ROLE
from airflow_mpi.spec import Role

# Waiting reasons that never fix themselves: fail at once with the pod's own message.
FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "ErrImageNeverPull",
        "RunContainerError",
    }
)


# A running pod whose Node stopped reporting: the node lifecycle controller turns its Ready
# condition False (after the Node's grace period, 40 s by default) while the kubelet, gone,
# still has every container ready. Its ranks are cut off from the job: fail at once.
NODE_LOST = "NodeNotReady"
NODE_LOST_MESSAGE = (
    "its Node {node} stopped reporting (kubelet down or Node unreachable) and the cluster marked the pod "
    "not ready; an MPI job cannot go on without that Node's ranks: check `kubectl describe node {node}`"
)


# A pod the taint eviction controller is deleting from its Node for a NoExecute taint: the Node
# stopped reporting or is not ready (every job pod leaves such a Node 20 s after:
# ``kinds.tolerations.NODE_LOST_TAINTS``), or an administrator tainted it. A pod never Ready when
# its Node went silent gets no other mark; its deletion then waits on a kubelet that may never answer.
NODE_EVICTED = "DeletionByTaintManager"
NODE_EVICTED_MESSAGE = (
    "the cluster is evicting it from Node {node} for a NoExecute taint (the Node stopped reporting, is not "
    "ready, or was tainted); an MPI job cannot go on without that Node's ranks: check `kubectl describe node {node}`"
)
# Both read as a lost Node: the job fails at once, and teardown deletes such pods without waiting.
NODE_GONE_REASONS = frozenset({NODE_LOST, NODE_EVICTED})


class PodPhase(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class PodState:
    name: str
    role: Role
    phase: PodPhase
    ready: bool = False
    exit_code: int | None = None
    reason: str = ""  # e.g. OOMKilled, Evicted, ErrImagePull, Unschedulable
    message: str = ""
    node: str = ""  # the Node it was bound to (Kubernetes)

    @property
    def ended(self) -> bool:
        return self.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)

    def describe(self) -> str:
        parts = [f"pod {self.name} ({self.role.value}) {self.phase.value.lower()}"]
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        if self.reason:
            parts.append(self.reason)
        if self.message:
            parts.append(self.message)
        return ", ".join(parts)


class JobPhase(str, Enum):
    STARTING = "starting"  # workers not all ready yet
    READY = "ready"  # every worker ready, master not started
    RUNNING = "running"  # master started
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class JobStatus:
    phase: JobPhase
    failed_pod: str | None = None
    exit_code: int | None = None
    reason: str = ""


def evaluate_job(pods: Sequence[PodState]) -> JobStatus:
    """The job's phase from its pods. A worker that ends, for any reason, while the job is not done
    fails the job: workers only run sshd, and an MPI job cannot lose a rank's node."""
    master = next((p for p in pods if p.role is Role.MASTER), None)
    workers = [p for p in pods if p.role is Role.WORKER]

    for pod in pods:
        if pod.reason in FATAL_WAITING_REASONS or (pod.reason in NODE_GONE_REASONS and not pod.ended):
            return JobStatus(JobPhase.FAILED, pod.name, pod.exit_code, pod.describe())
    # A worker lost while the master is still going is the root cause, whatever the master says next.
    master_done = master is not None and master.phase is PodPhase.SUCCEEDED
    if not master_done:
        for worker in workers:
            if worker.ended:
                return JobStatus(JobPhase.FAILED, worker.name, worker.exit_code, worker.describe())
    if master is not None:
        if master.phase is PodPhase.FAILED:
            return JobStatus(JobPhase.FAILED, master.name, master.exit_code, master.describe())
        if master.phase is PodPhase.SUCCEEDED:
            return JobStatus(JobPhase.SUCCEEDED, exit_code=0)
        return JobStatus(JobPhase.RUNNING)  # created: pending or running
    if workers and not all(w.ready for w in workers):
        return JobStatus(JobPhase.STARTING)
    return JobStatus(JobPhase.READY)


# --- Kubernetes pods -> PodState ----------------------------------------------------------------


def pod_state_from_k8s(pod: Mapping[str, Any]) -> PodState:
    """What a Kubernetes pod (as the API returns it, plain JSON) is doing."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    role = Role((meta.get("labels") or {}).get(LABEL_ROLE, Role.WORKER.value))
    name = meta.get("name", "")
    phase = (
        PodPhase(status.get("phase", "Pending"))
        if status.get("phase") in PodPhase._value2member_map_
        else PodPhase.UNKNOWN
    )
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    reason, message, exit_code = status.get("reason", ""), status.get("message", ""), None
    containers = status.get("containerStatuses") or []
    state = (containers[0].get("state") or {}) if containers else {}
    if "terminated" in state:
        terminated = state["terminated"]
        exit_code = terminated.get("exitCode")
        if not reason or terminated.get("reason") == "OOMKilled":
            reason = terminated.get("reason", "")
        message = message or terminated.get("message", "")
    elif "waiting" in state and state["waiting"].get("reason") not in (None, "ContainerCreating", "PodInitializing"):
        reason = state["waiting"].get("reason", "")
        message = state["waiting"].get("message", "")
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        reason, message = "Unschedulable", scheduled.get("message", "")
    elif phase is PodPhase.PENDING and not scheduled and not reason:
        # Every scheduler records its decision in this condition: none at all means none has
        # looked at the pod (reported only if the pod is still waiting at startup_timeout).
        reason = "NotScheduled"
        message = (
            "no scheduler has looked at the pod: check that the cluster's scheduler (or the one "
            "scheduling.scheduler_name names) is running"
        )
    if reason == "Completed" and exit_code == 0:
        reason = ""
    node = (pod.get("spec") or {}).get("nodeName", "")
    if _node_lost(phase, conditions.get("Ready"), containers):
        reason, message = NODE_LOST, NODE_LOST_MESSAGE.format(node=node or "NODE")
    elif not reason and _evicted_by_taint(phase, conditions.get("DisruptionTarget")):
        reason, message = NODE_EVICTED, NODE_EVICTED_MESSAGE.format(node=node or "NODE")
    return PodState(name, role, phase, ready=ready, exit_code=exit_code, reason=reason, message=message, node=node)


def _node_lost(phase: PodPhase, ready: Mapping[str, Any] | None, containers: Sequence[Mapping[str, Any]]) -> bool:
    """The node lifecycle controller's mark: Ready False, with no reason, on a running pod whose
    containers the kubelet last reported all ready. The kubelet's own not-ready always gives a
    reason (ContainersNotReady, ReadinessGatesNotReady) and shows in the containers."""
    return (
        phase is PodPhase.RUNNING
        and (ready or {}).get("status") == "False"
        and not (ready or {}).get("reason")
        and bool(containers)
        and all(c.get("ready") is True for c in containers)
    )


def _evicted_by_taint(phase: PodPhase, disruption: Mapping[str, Any] | None) -> bool:
    """The taint eviction controller's mark on a pod it is about to delete (``NODE_EVICTED``)."""
    mark = disruption or {}
    going = phase in (PodPhase.PENDING, PodPhase.RUNNING)
    return going and mark.get("status") == "True" and mark.get("reason") == NODE_EVICTED


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What ``pod_state_from_k8s`` reads, and nothing else: a watch of 1000 pods keeps no specs
    (every pod's env holds the full worker list)."""
    meta = pod.get("metadata") or {}
    return {
        "metadata": {
            key: meta[key]
            for key in ("name", "labels", "resourceVersion", "deletionTimestamp", "creationTimestamp")
            if key in meta
        },
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName", "")},
        "status": pod.get("status") or {},
    }


class PodTable:
    """The job's pods as a watch sees them: apply events, relist on 410, keep the resourceVersion."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: set[str] = set()
        self.resource_version = ""
        self.events = 0

    def replace(self, items: list[Mapping[str, Any]], resource_version: str) -> None:
        """A fresh list (the start, or after 410 Gone)."""
        current = {item["metadata"]["name"]: slim_pod(item) for item in items}
        self.deleted |= set(self.pods) - set(current)
        self.pods = current
        self.resource_version = resource_version
        self.events += 1

    def apply(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; False when the watch expired (410): relist and watch again."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                return False
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        meta = obj.get("metadata") or {}
        self.resource_version = meta.get("resourceVersion", self.resource_version)
        if kind == "BOOKMARK":
            return True
        name = meta.get("name", "")
        if kind == "DELETED":
            self.pods.pop(name, None)
            self.deleted.add(name)
        else:
            self.pods[name] = slim_pod(obj)
            self.deleted.discard(name)
        self.events += 1
        return True

    def states(self, expected: Mapping[str, Role] | None = None) -> list[PodState]:
        """Every pod's state; an expected pod that was deleted counts as failed, one not seen yet
        as pending."""
        states = [pod_state_from_k8s(pod) for pod in self.pods.values()]
        for name, role in (expected or {}).items():
            if name in self.pods:
                continue
            generated = self.generated(name, role)
            if generated:  # e.g. mpi-operator's launcher: a batch Job names its pod; the newest counts
                newest = generated[-1]
                states = [
                    _as_expected(state, name) if state.name == newest else state
                    for state in states
                    if state.name == newest or state.name not in generated
                ]
                continue
            if self.was_deleted(name, role):
                states.append(PodState(name, role, PodPhase.FAILED, reason="Deleted", message="the pod was deleted"))
            else:
                states.append(PodState(name, role, PodPhase.PENDING))
        return states

    def was_deleted(self, name: str, role: Role) -> bool:
        """Whether the expected pod ``name`` (or the pod a controller generated for it) is gone
        after the watch saw it: deleted, and none of its generated pods is left."""
        if name in self.pods or self.generated(name, role):
            return False
        return name in self.deleted or any(gone.startswith(f"{name}-") for gone in self.deleted)

    def generated(self, name: str, role: Role) -> list[str]:
        """Pods of ``role`` named ``<name>-<suffix>``, oldest first: the pods a controller made
        for the expected ``name`` (a batch Job names its pods ``<job>-<random>``)."""
        found = sorted(
            ((pod["metadata"].get("creationTimestamp") or ""), pod_name)
            for pod_name, pod in self.pods.items()
            if pod_name.startswith(f"{name}-") and (pod["metadata"].get("labels") or {}).get(LABEL_ROLE) == role.value
        )
        return [pod_name for _, pod_name in found]


def _as_expected(state: PodState, name: str) -> PodState:
    """A generated pod's state under the name the plan expects, its own name in the message."""
    message = f"{state.message}; pod {state.name}" if state.message else f"pod {state.name}"
    return replace(state, name=name, message=message)


class WatchLoop:
    """The list/watch loop over a job's pods that the backend's watch thread and the trigger's
    coroutine both drive, as decisions only (the drivers make the requests): list when there is
    no resourceVersion (the start, or after 410 Gone), else watch from it; after a failure, wait
    with a doubling back-off, which a watch that ran its course resets."""

    def __init__(self, first_backoff: float = 0.1, max_backoff: float = 5.0) -> None:
        self.table = PodTable()
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self._backoff = first_backoff

    @property
    def must_list(self) -> bool:
        return not self.table.resource_version

    def listed(self, items: list[Mapping[str, Any]], resource_version: str) -> None:
        self.table.replace(items, resource_version)

    def apply(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; False when the watch expired (410 Gone): end it, the next
        round lists again."""
        if self.table.apply(event):
            return True
        self.table.resource_version = ""
        return False

    def watch_ended(self) -> None:
        """The watch ended by itself (server timeout, or expired): no back-off before the next."""
        self._backoff = self.first_backoff

    def failed(self, *, gone: bool) -> float:
        """A request failed: the seconds to wait before the next round. ``gone``: the API server
        answered 410 (the resourceVersion is too old), so the next round lists again."""
        if gone:
            self.table.resource_version = ""
        delay = self._backoff
        self._backoff = min(self._backoff * 2, self.max_backoff)
        return delay
