"""Kueue's MPIJob integration for the API double: an MPIJob labelled ``kueue.x-k8s.io/queue-name``
is suspended by Kueue's webhook on create (``spec.runPolicy.suspend: true``), gets a Workload
owned by it, and is resumed (suspend false) once the Workload is admitted. Until then the MPIJob
controller keeps it ``Suspended=True`` with no pods: a queued job. The Workload is marked
``Finished`` when the MPIJob succeeds or fails.

Modelled on Kueue's ``pkg/controller/jobs/mpijob`` and ``jobframework``; the Workload's name
(``mpijob-<job>-<5 hex>``) follows ``GetWorkloadNameForOwnerWithGVK`` in form, its hash input is
[unverified]; quota is not modelled: ``hold_admission(seconds)`` keeps every Workload waiting.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from tests.doubles import mpijob_objects as mo
from tests.doubles.kube_double import ApiError, KubeDouble, rfc3339
from tests.doubles.mpijob_controller import MPIJobController

Obj = dict[str, Any]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOADS = ("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")


def workload_name(job: Obj) -> str:
    key = f"{job['metadata']['name']}/{job['metadata']['uid']}".encode()
    digest = hashlib.sha1(key, usedforsecurity=False).hexdigest()[:5]
    return f"mpijob-{job['metadata']['name']}"[:57] + f"-{digest}"


class KueueMPIJobs:
    """Plug into a double that has an ``MPIJobController`` (before ``start``)."""

    def __init__(self, double: KubeDouble, controller: MPIJobController, tick: float = 0.02) -> None:
        self.double, self.plural, self.tick = double, controller.plural, tick
        self.workloads = double.register_custom(*WORKLOADS)
        self.hold_until = 0.0
        self.log: list[str] = []
        defaults = double.custom_defaulters.get(self.plural)

        def webhook(job: Obj) -> None:
            if defaults is not None:
                defaults(job)
            if (job["metadata"].get("labels") or {}).get(QUEUE_LABEL):
                job["spec"].setdefault("runPolicy", {})["suspend"] = True

        double.custom_defaulters[self.plural] = webhook
        self._wake = threading.Event()
        self._stop = threading.Event()
        double.listeners.append(lambda event, plural, obj: self._wake.set())
        self._thread = threading.Thread(target=self._run, name="kueue-mpijobs", daemon=True)
        self._thread.start()

    def hold_admission(self, seconds: float) -> None:
        self.hold_until = time.monotonic() + seconds

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick)
            self._wake.clear()
            try:
                for job in self.double.list_objects(self.plural):
                    self._sync(job)
            except ApiError:
                continue

    def _sync(self, job: Obj) -> None:
        meta = job["metadata"]
        queue = (meta.get("labels") or {}).get(QUEUE_LABEL)
        if not queue or meta.get("deletionTimestamp"):
            return
        name = workload_name(job)
        workload = self.double.get(self.workloads, meta["namespace"], name)
        if workload is None:
            workload = self.double.create(self.workloads, meta["namespace"], self._workload(job, name, queue))
            self.log.append(f"created Workload {name}")
        conditions = {c["type"] for c in (workload.get("status") or {}).get("conditions") or []}
        status = job.get("status") or {}
        if mo.finished(status) and "Finished" not in conditions:
            self._set_conditions(workload, ["Finished"])
        elif "Admitted" not in conditions and time.monotonic() >= self.hold_until:
            self._set_conditions(workload, ["QuotaReserved", "Admitted"])
            self.log.append(f"admitted {name}")
        if "Admitted" in conditions and mo.suspended(job) and "Finished" not in conditions:
            self.double.update_object(
                self.plural, meta["namespace"], meta["name"], lambda j: j["spec"]["runPolicy"].update(suspend=False)
            )
            self.log.append(f"resumed {meta['name']}")

    def _workload(self, job: Obj, name: str, queue: str) -> Obj:
        replicas = job["spec"]["mpiReplicaSpecs"]
        pod_sets = [{"name": "launcher", "count": 1}]
        if replicas.get("Worker"):
            pod_sets.append({"name": "worker", "count": int(replicas["Worker"].get("replicas") or 0)})
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": {
                "name": name,
                "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]},
                "ownerReferences": [mo.controller_ref(job)],
            },
            "spec": {"queueName": queue, "podSets": pod_sets},
        }

    def _set_conditions(self, workload: Obj, kinds: list[str]) -> None:
        stamp = rfc3339(time.time())

        def change(w: Obj) -> None:
            status = w.setdefault("status", {})
            if "Admitted" in kinds:
                status["admission"] = {"clusterQueue": "cluster-queue"}
            status["conditions"] = [
                *(status.get("conditions") or []),
                *({"type": k, "status": "True", "reason": k, "lastTransitionTime": stamp} for k in kinds),
            ]

        self.double.update_object(
            self.workloads, workload["metadata"]["namespace"], workload["metadata"]["name"], change
        )
