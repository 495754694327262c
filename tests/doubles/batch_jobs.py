"""A minimal batch/v1 Job controller for the API double: what mpi-operator's launcher Job needs.

As kube-controller-manager's job controller behaves for a NonIndexed Job of one completion:
the apiserver's defaults on create (selector ``batch.kubernetes.io/controller-uid``, the
``job-name`` labels, ``backoffLimit`` 6); one pod ``<job>-<5 random chars>`` owned by the Job;
``status.active/ready/succeeded/failed``, ``startTime``/``completionTime``; ``Complete`` when the
pod succeeds; ``Failed`` with ``BackoffLimitExceeded`` once more pods failed than ``backoffLimit``
(restartPolicy Never: a new pod per failure) or, under OnFailure, once the container restarted
more often than that: the kubelet restarts it in place and at the limit the Job deletes the pod
and its log with it (mpi-operator#154); ``DeadlineExceeded`` past ``activeDeadlineSeconds`` from
``startTime``, killing the running pod; ``suspend`` deletes the active pod and stops the clock.

An in-place restart asks the kubelet to start the pod again: ``ScriptedKubelet`` plays its script
anew; ``RealKubelet`` cannot restart a sandbox pod, so use restartPolicy Never with it.

Not modelled: the ``batch.kubernetes.io/job-tracking`` pod finalizer, Indexed jobs, parallelism
over 1, pod failure policies, ``FailureTarget``/``SuccessCriteriaMet`` interim conditions.
"""

from __future__ import annotations

import calendar
import copy
import time
import uuid
from typing import Any

from tests.doubles.kube_double import ApiError, KubeDouble, LogBuffer, rfc3339

Obj = dict[str, Any]
BATCH_JOBS = ("batch", "v1", "jobs", "Job")
UID_LABEL = "batch.kubernetes.io/controller-uid"
NAME_LABEL = "batch.kubernetes.io/job-name"
DEFAULT_BACKOFF_LIMIT = 6


def default_job(job: Obj) -> None:
    """The apiserver's defaulting of a Job on create: selector and pod labels by the Job's uid."""
    meta, spec = job["metadata"], job.setdefault("spec", {})
    labels = {UID_LABEL: meta["uid"], NAME_LABEL: meta["name"], "controller-uid": meta["uid"], "job-name": meta["name"]}
    if not spec.get("selector"):
        spec["selector"] = {"matchLabels": {UID_LABEL: meta["uid"]}}
        template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}
    spec.setdefault("backoffLimit", DEFAULT_BACKOFF_LIMIT)
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)


def _seconds(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class BatchJobs:
    """Serves ``/apis/batch/v1/.../jobs`` on the double and reconciles them (``reconcile``)."""

    def __init__(self, double: KubeDouble) -> None:
        self.double = double
        self.plural = double.register_custom(*BATCH_JOBS)
        double.custom_defaulters[self.plural] = default_job
        double.status_subresources.add(self.plural)
        self.restarts: dict[str, int] = {}  # pod uid -> container restarts (OnFailure)
        self.log: list[str] = []

    def pods_of(self, job: Obj) -> list[Obj]:
        uid = job["metadata"]["uid"]
        return [
            p
            for p in self.double.list_objects("pods", job["metadata"]["namespace"])
            if any(r.get("uid") == uid and r.get("controller") for r in p["metadata"].get("ownerReferences") or [])
        ]

    def reconcile(self) -> None:
        for job in self.double.list_objects(self.plural):
            if not job["metadata"].get("deletionTimestamp"):
                self._sync(job)

    def _sync(self, job: Obj) -> None:
        status = job.get("status") or {}
        conditions = status.get("conditions") or []
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions):
            return
        spec = job["spec"]
        pods = self.pods_of(job)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        on_failure = spec["template"]["spec"].get("restartPolicy") == "OnFailure"
        ended = ("Succeeded",) if on_failure else ("Succeeded", "Failed")  # OnFailure: restarted in place
        active = [p for p in live if _phase(p) not in ended]
        if spec.get("suspend"):
            for pod in active:
                self._delete_pod(pod)
            self._set_status(job, active=0, ready=0, start=None, suspended=True)
            return
        start = status.get("startTime") or rfc3339(time.time())
        failed = 0 if on_failure else sum(1 for p in pods if _phase(p) == "Failed")
        succeeded = sum(1 for p in pods if _phase(p) == "Succeeded")
        restarts = self._restart_failed_containers(job, active) if on_failure else 0
        limit = int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
        deadline = spec.get("activeDeadlineSeconds")
        if succeeded >= int(spec.get("completions", 1)):
            self._finish(
                job, "Complete", "CompletionsReached", "Reached expected number of succeeded pods", active, failed
            )
        elif failed + restarts > limit:
            self._finish(
                job, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit", active, failed
            )
        elif deadline is not None and time.time() - _seconds(start) >= int(deadline):
            self._finish(
                job, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline", active, failed
            )
        else:
            if not active and not [p for p in pods if p["metadata"].get("deletionTimestamp")]:
                self._create_pod(job)
                active = [{}]
            ready = sum(1 for p in active if p and _ready(p))
            self._set_status(job, active=len(active), ready=ready, start=start, failed=failed)

    def _restart_failed_containers(self, job: Obj, pods: list[Obj]) -> int:
        """Under OnFailure the kubelet restarts a failed container in place: the pod stays, its
        restartCount grows, and the Job counts the restarts against backoffLimit (returned)."""
        limit = int(job["spec"].get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
        for pod in pods:
            if _phase(pod) != "Failed":
                continue
            meta = pod["metadata"]
            count = self.restarts[meta["uid"]] = self.restarts.get(meta["uid"], 0) + 1
            if count > limit:
                continue  # the Job fails now and deletes the pod

            def restart(p: Obj, count: int = count) -> None:
                p["status"] = {"phase": "Pending", "conditions": (p.get("status") or {}).get("conditions") or []}
                for state in p["status"].get("containerStatuses") or []:
                    state["restartCount"] = count

            self.double.update_pod_status(meta["namespace"], meta["name"], restart)
            self.double.logs[(meta["namespace"], meta["name"])] = LogBuffer()
            self.log.append(f"restarted {meta['name']} ({count})")
            self.double.start_pod(meta["namespace"], meta["name"])
        return sum(self.restarts.get(p["metadata"]["uid"], 0) for p in pods)

    def _create_pod(self, job: Obj) -> None:
        template = copy.deepcopy(job["spec"]["template"])
        meta = template.get("metadata") or {}
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        pod_meta: Obj = {"generateName": f"{job['metadata']['name']}-", "labels": meta.get("labels") or {}}
        if meta.get("annotations"):
            pod_meta["annotations"] = meta["annotations"]
        pod_meta["ownerReferences"] = [owner]
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template["spec"]}
        try:
            pod = self.double.create("pods", job["metadata"]["namespace"], body)
        except ApiError as error:  # the Job's FailedCreate event; retried on the next round
            self._event(job, "Warning", "FailedCreate", f"Error creating: {error.message}")
            return
        self._event(job, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}")

    def _delete_pod(self, pod: Obj) -> None:
        try:
            self.double.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError:
            pass

    def _finish(self, job: Obj, kind: str, reason: str, message: str, active: list[Obj], failed: int) -> None:
        for pod in active:
            self._delete_pod(pod)  # DeadlineExceeded kills the runner; OnFailure's pod goes (#154)
        stamp = rfc3339(time.time())

        def change(j: Obj) -> None:
            status = j.setdefault("status", {})
            status["startTime"] = status.get("startTime") or stamp
            status["active"], status["ready"] = 0, 0
            if kind == "Complete":
                status["succeeded"] = int(status.get("succeeded") or 0) + 1
                status["completionTime"] = stamp
            else:
                status["failed"] = max(failed + len(active), 1)  # killed pods count as failed
            condition = {"type": kind, "status": "True", "reason": reason, "message": message}
            condition.update(lastProbeTime=stamp, lastTransitionTime=stamp)
            status["conditions"] = [*(status.get("conditions") or []), condition]

        self.double.update_object(self.plural, job["metadata"]["namespace"], job["metadata"]["name"], change)
        self.log.append(f"{job['metadata']['name']}: {kind} {reason}")
        event_reason = "Completed" if kind == "Complete" else reason
        self._event(job, "Normal" if kind == "Complete" else "Warning", event_reason, message)

    def _set_status(
        self, job: Obj, *, active: int, ready: int, start: str | None, failed: int = 0, suspended: bool = False
    ) -> None:
        old = job.get("status") or {}
        wanted = {**old, "active": active, "ready": ready}
        if failed:
            wanted["failed"] = failed
        wanted.pop("startTime", None)
        if start is not None:
            wanted["startTime"] = start
        was_suspended = any(c["type"] == "Suspended" for c in old.get("conditions") or [])
        if suspended and not was_suspended:
            stamp = rfc3339(time.time())
            condition = {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}
            wanted["conditions"] = [*(old.get("conditions") or []), {**condition, "lastTransitionTime": stamp}]
        elif not suspended and was_suspended:
            wanted["conditions"] = [c for c in old["conditions"] if c["type"] != "Suspended"]
        if wanted == old:
            return

        def change(j: Obj) -> None:
            j["status"] = wanted

        self.double.update_object(self.plural, job["metadata"]["namespace"], job["metadata"]["name"], change)

    def _event(self, job: Obj, kind: str, reason: str, message: str) -> None:
        record_event(self.double, job, "job-controller", kind, reason, message)


def record_event(double: KubeDouble, obj: Obj, component: str, kind: str, reason: str, message: str) -> None:
    """An Event about any object, as a controller's recorder writes it."""
    meta = obj["metadata"]
    stamp = rfc3339(time.time())
    body = {
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion", "v1"),
            "kind": obj.get("kind", ""),
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": component},
    }
    try:
        double.create("events", meta["namespace"], body)
    except ApiError:
        pass  # its namespace is being deleted
