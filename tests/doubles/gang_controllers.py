"""Gang schedulers and Volcano's job controller for the API double, as their sources behave.

- Volcano's job controller: a ``batch.volcano.sh/v1alpha1`` Job gets a PodGroup ``<job>-<uid>``;
  once the group is admitted it creates the pods ``<job>-<task>-<i>`` (hostname = pod name,
  subdomain = job), the ``svc`` plugin's headless Service ``<job>`` and ConfigMap ``<job>-svc``
  with ``VC_<TASK>_HOSTS``/``VC_<TASK>_NUM`` env, the ``env`` plugin's ``VC_TASK_INDEX``. Phases
  Pending -> Running -> Completed/Terminated; policies ``TaskCompleted -> CompleteJob`` and
  ``PodFailed``/``PodEvicted -> TerminateJob``; a kill deletes Running pods and keeps Succeeded and
  Failed ones; deleting the Job garbage-collects everything it owns.
- PodGroups (``scheduling.volcano.sh`` and ``scheduling.x-k8s.io``): member pods are held
  (``PodScheduled=False``) until ``minMember`` of them exist and the cluster has room for all;
  then all start at once. Volcano's group waits ``Pending`` (no room) or ``Inqueue`` (room, pods
  missing); coscheduling's ``Pending``.
- Kueue plain-pod groups: its webhook gates each pod (``kueue.x-k8s.io/admission``) and adds its
  finalizer; once ``pod-group-total-count`` pods exist a Workload named after the group is
  created and admitted when all of it fits, and the gates go. The finalizer is lifted when the
  Workload finished or is deleted, so a teardown must delete the Workload.

Knobs: ``gpus_per_node`` (capacity: a gang fits only when every pod gets a node with its GPUs;
None: unlimited) and ``hold_admission(seconds)`` (no group is admitted before then).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

from tests.doubles.kube_double import ApiError, KubeDouble, rfc3339

Obj = dict[str, Any]

VOLCANO_JOBS = ("batch.volcano.sh", "v1alpha1", "jobs", "Job")
VOLCANO_GROUPS = ("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
COSCHEDULING_GROUPS = ("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
KUEUE_WORKLOADS = ("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_RETRIABLE = "kueue.x-k8s.io/retriable-in-group"
KUEUE_GATE = "kueue.x-k8s.io/admission"
KUEUE_FINALIZER = "kueue.x-k8s.io/managed"
GPU = "nvidia.com/gpu"
TERMINAL = ("Succeeded", "Failed")


def _gpus(pod: Obj) -> int:
    total = 0
    for container in pod["spec"].get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(GPU) or (resources.get("limits") or {}).get(GPU) or 0
        total += int(amount)
    return total


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


class GangControllers:
    """Plugs Volcano, coscheduling and Kueue into a ``KubeDouble`` (call before ``start``)."""

    def __init__(self, double: KubeDouble, *, gpus_per_node: list[int] | None = None, tick: float = 0.02) -> None:
        self.double = double
        self.gpus_per_node = gpus_per_node
        self.tick = tick
        self.hold_until = 0.0
        self.placements: dict[tuple[str, str], int] = {}  # (ns, pod) -> node index
        self.admitted: set[tuple[str, str]] = set()  # (ns, group name) of every admitted group
        self.log: list[str] = []  # what happened, in order (admissions, actions), for tests
        self.made_workloads: set[tuple[str, str]] = set()
        self.admissions: list[tuple[float, str]] = []  # (time.monotonic(), group), in order
        self.started: set[tuple[str, str]] = set()  # (ns, pod) handed to the kubelet, once each
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self.jobs = double.register_custom(*VOLCANO_JOBS)
        self.volcano_groups = double.register_custom(*VOLCANO_GROUPS)
        self.cosched_groups = double.register_custom(*COSCHEDULING_GROUPS)
        self.workloads = double.register_custom(*KUEUE_WORKLOADS)
        double.listeners.append(lambda event, plural, obj: self._wake.set())
        double.pod_gates.append(self._held)
        double.pod_webhooks.append(self._kueue_webhook)
        self._thread = threading.Thread(target=self._run, name="gang-controllers", daemon=True)
        self._thread.start()

    # --- knobs ------------------------------------------------------------------------------

    def hold_admission(self, seconds: float) -> None:
        self.hold_until = time.monotonic() + seconds

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)

    # --- which group a pod belongs to -------------------------------------------------------

    @staticmethod
    def group_of(pod: Obj) -> tuple[str, str] | None:
        meta = pod["metadata"]
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        for name in (
            annotations.get(VOLCANO_GROUP_ANNOTATION),
            labels.get(COSCHEDULING_LABEL),
            labels.get(KUEUE_GROUP_LABEL) if labels.get(KUEUE_QUEUE_LABEL) else None,
        ):
            if name:
                return (meta["namespace"], name)
        return None

    def _held(self, pod: Obj) -> bool:
        """The double's gate on create: hold a member of a group not admitted yet, and never let
        a pod start twice (its group may be admitted while it is being created)."""
        group = self.group_of(pod)
        if group is None:
            return False
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        with self._lock:
            if group not in self.admitted or key in self.started:
                return True
            self.started.add(key)
            return False

    def _start(self, namespace: str, name: str) -> None:
        if (namespace, name) not in self.started:
            self.started.add((namespace, name))
            self.double.start_pod(namespace, name)

    def _kueue_webhook(self, pod: Obj) -> None:
        meta = pod["metadata"]
        if not (meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL):
            return
        meta["labels"]["kueue.x-k8s.io/managed"] = "true"
        meta.setdefault("finalizers", []).append(KUEUE_FINALIZER)
        pod["spec"].setdefault("schedulingGates", []).append({"name": KUEUE_GATE})

    # --- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick)
            self._wake.clear()
            try:
                self.reconcile()
            except ApiError:
                continue  # a race with a deletion: the next round sees the new state

    def reconcile(self) -> None:
        with self._lock:
            for job in self.double.list_objects(self.jobs):
                self._volcano_job(job)
            for plural in (self.volcano_groups, self.cosched_groups):
                for group in self.double.list_objects(plural):
                    self._pod_group(plural, group)
            self._kueue_groups()
            self._release_finished()

    # --- capacity ---------------------------------------------------------------------------

    def _fits(self, gpus: list[int]) -> list[int] | None:
        """A node for each pod (first fit, largest first), or None when the gang does not fit."""
        if self.gpus_per_node is None:
            return [0] * len(gpus)
        free = list(self.gpus_per_node)  # what the live (not ended) placed pods leave
        for (namespace, name), node in self.placements.items():
            pod = self.double.get("pods", namespace, name)
            if pod is not None and _phase(pod) not in TERMINAL:
                free[node] -= _gpus(pod)
        order = sorted(range(len(gpus)), key=lambda i: -gpus[i])
        chosen = [0] * len(gpus)
        for index in order:
            fitting = [n for n, room in enumerate(free) if room >= gpus[index]]
            if not fitting:
                return None
            free[fitting[0]] -= gpus[index]
            chosen[index] = fitting[0]
        return chosen

    def _admit(self, key: tuple[str, str], pods: list[Obj]) -> bool:
        """Admit a whole group when it fits and nothing holds admission; place its pods."""
        if time.monotonic() < self.hold_until:
            return False
        nodes = self._fits([_gpus(pod) for pod in pods])
        if nodes is None:
            return False
        for pod, node in zip(pods, nodes):
            self.placements[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = node
        self.admitted.add(key)
        self.log.append(f"admitted {key[1]}")
        self.admissions.append((time.monotonic(), key[1]))
        return True

    def _release_finished(self) -> None:
        for namespace, name in list(self.placements):
            pod = self.double.get("pods", namespace, name)
            if pod is None:
                del self.placements[(namespace, name)]

    def _mark_waiting(self, pod: Obj, message: str) -> None:
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "PodScheduled" and c.get("message") == message for c in conditions):
            return

        def change(p: Obj) -> None:
            p.setdefault("status", {})["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": rfc3339(time.time()),
                }
            ]

        self.double.update_object("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], change)

    # --- PodGroups of plain pods (and of Volcano Jobs) -----------------------------------------

    def _members(self, namespace: str, group: str) -> list[Obj]:
        return [
            pod
            for pod in self.double.list_objects("pods", namespace)
            if self.group_of(pod) == (namespace, group) and not pod["metadata"].get("deletionTimestamp")
        ]

    def _pod_group(self, plural: str, group: Obj) -> None:
        meta = group["metadata"]
        key = (meta["namespace"], meta["name"])
        members = self._members(*key)
        if key in self.admitted:
            for pod in members:  # late members of an admitted group start at once
                if (pod["metadata"]["namespace"], pod["metadata"]["name"]) not in self.placements:
                    self.placements[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = 0
                    self._start(key[0], pod["metadata"]["name"])
            self._set_group_phase(plural, group, "Running")
            return
        need = int(group["spec"].get("minMember") or 1)
        fits = self._fits([_gpus(pod) for pod in members]) is not None and time.monotonic() >= self.hold_until
        if len(members) >= need and members and self._admit(key, members):
            for pod in members:
                self._start(key[0], pod["metadata"]["name"])
            self._set_group_phase(plural, group, "Running")
            return
        volcano = plural == self.volcano_groups
        phase = "Inqueue" if volcano and fits else "Pending"
        self._set_group_phase(plural, group, phase)
        if volcano:  # vc-scheduler's own wording (JobInfo.FitError), which names no group or queue
            message = (
                f"pod group is not ready, {len(members)} Pending, {need} minAvailable; Pending: {len(members)} "
                + ("Unschedulable" if fits else "Unschedulable, the cluster has no room for the whole group now")
            )
        else:
            message = f"pod group {meta['name']} is {phase}: {len(members)} of {need} pods exist" + (
                "" if fits else "; the cluster has no room for the whole group now"
            )
        for pod in members:
            self._mark_waiting(pod, message)

    def _set_group_phase(self, plural: str, group: Obj, phase: str) -> None:
        if (group.get("status") or {}).get("phase") == phase:
            return

        def change(g: Obj) -> None:
            g.setdefault("status", {})["phase"] = phase

        self.double.update_object(plural, group["metadata"]["namespace"], group["metadata"]["name"], change)

    # --- Kueue --------------------------------------------------------------------------------

    def _kueue_groups(self) -> None:
        groups: dict[tuple[str, str], list[Obj]] = {}
        for pod in self.double.list_objects("pods"):
            labels = pod["metadata"].get("labels") or {}
            if labels.get(KUEUE_QUEUE_LABEL) and labels.get(KUEUE_GROUP_LABEL):
                groups.setdefault((pod["metadata"]["namespace"], labels[KUEUE_GROUP_LABEL]), []).append(pod)
        for (namespace, name), pods in groups.items():
            workload = self.double.get(self.workloads, namespace, name)
            total = int((pods[0]["metadata"].get("annotations") or {}).get(KUEUE_TOTAL, "1"))
            if workload is None and (namespace, name) not in self.made_workloads and len(pods) >= total:
                workload = self._create_workload(namespace, name, pods)
            self._kueue_finalizers(namespace, name, pods, workload)
            if workload is None or (namespace, name) in self.admitted:
                continue
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            if self._admit((namespace, name), live):
                self.double.update_object(self.workloads, namespace, name, self._admitted_status)
                for pod in live:
                    self.double.update_object("pods", namespace, pod["metadata"]["name"], _ungate)
                    self._start(namespace, pod["metadata"]["name"])
            else:
                for pod in live:
                    self._mark_waiting(pod, f"waiting for quota in LocalQueue {_queue_of(pod)} (workload {name})")

    def _create_workload(self, namespace: str, name: str, pods: list[Obj]) -> Obj:
        group, version, _, kind = KUEUE_WORKLOADS
        body = {
            "apiVersion": f"{group}/{version}",
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"queueName": _queue_of(pods[0]), "podSets": [{"name": "main", "count": len(pods)}]},
        }
        self.made_workloads.add((namespace, name))
        return self.double.create(self.workloads, namespace, body)

    @staticmethod
    def _admitted_status(workload: Obj) -> None:
        now = rfc3339(time.time())
        workload["status"] = {
            "admission": {"clusterQueue": "cluster-queue"},
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": now},
                {"type": "Admitted", "status": "True", "lastTransitionTime": now},
            ],
        }

    def _kueue_finalizers(self, namespace: str, name: str, pods: list[Obj], workload: Obj | None) -> None:
        """The finalizer goes once the Workload is gone, or finished: every pod Succeeded, or a
        non-retriable pod ended and nothing runs."""
        running = [p for p in pods if _phase(p) not in TERMINAL]
        ended_for_good = any(
            _phase(p) in TERMINAL and (p["metadata"].get("annotations") or {}).get(KUEUE_RETRIABLE) == "false"
            for p in pods
        )
        finished = all(_phase(p) == "Succeeded" for p in pods) or (ended_for_good and not running)
        gone = workload is None and (namespace, name) in self.made_workloads
        if not (finished or gone or (workload or {}).get("metadata", {}).get("deletionTimestamp")):
            return
        for pod in pods:
            if KUEUE_FINALIZER in (pod["metadata"].get("finalizers") or []):
                self.double.update_object("pods", namespace, pod["metadata"]["name"], _drop_finalizer)

    # --- Volcano's job controller ----------------------------------------------------------------

    def _volcano_job(self, job: Obj) -> None:
        meta = job["metadata"]
        if meta.get("deletionTimestamp"):
            return
        namespace, name = meta["namespace"], meta["name"]
        phase = ((job.get("status") or {}).get("state") or {}).get("phase", "")
        group_name = f"{name}-{meta['uid']}"
        if not phase:
            self._create_job_group(job, group_name)
            self._set_job_phase(job, "Pending")
            return
        if phase in ("Completed", "Terminated", "Failed", "Aborted"):
            return
        pods = [p for p in self.double.list_objects("pods", namespace) if _owned_by(p, meta["uid"])]
        if phase == "Pending" and not pods:
            tasks = job["spec"]["tasks"]
            planned = [_pod_from_task(job, task, i, group_name) for task in tasks for i in range(task["replicas"])]
            if (namespace, group_name) not in self.admitted and not self._admit((namespace, group_name), planned):
                return
            self._set_group_phase(
                self.volcano_groups, {"metadata": {"namespace": namespace, "name": group_name}}, "Running"
            )
            self._create_svc_plugin_objects(job)
            for pod in planned:
                self.double.create("pods", namespace, pod)
            return
        self._apply_policies(job, phase, pods)

    def _create_job_group(self, job: Obj, group_name: str) -> None:
        meta = job["metadata"]
        group, version, _, kind = VOLCANO_GROUPS
        body = {
            "apiVersion": f"{group}/{version}",
            "kind": kind,
            "metadata": {"name": group_name, "namespace": meta["namespace"], "ownerReferences": [_owner(job)]},
            "spec": {"minMember": job["spec"].get("minAvailable", 1), "queue": job["spec"].get("queue", "default")},
        }
        if self.double.get(self.volcano_groups, meta["namespace"], group_name) is None:
            self.double.create(self.volcano_groups, meta["namespace"], body)

    def _create_svc_plugin_objects(self, job: Obj) -> None:
        meta = job["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        selector = {"volcano.sh/job-name": name, "volcano.sh/job-namespace": namespace}
        service = {
            "metadata": {"name": name, "namespace": namespace, "ownerReferences": [_owner(job)]},
            "spec": {"clusterIP": "None", "selector": selector, "ports": [{"name": "placeholder", "port": 1}]},
        }
        if self.double.get("services", namespace, name) is None:  # an existing one is reused silently
            self.double.create("services", namespace, service)
        data = {}
        for task in job["spec"]["tasks"]:
            hosts = [f"{name}-{task['name']}-{i}.{name}" for i in range(task["replicas"])]
            data[f"{task['name'].replace('-', '_')}.host"] = "\n".join(hosts)
            data[f"VC_{_env_name(task['name'])}_HOSTS"] = ",".join(hosts)
            data[f"VC_{_env_name(task['name'])}_NUM"] = str(task["replicas"])
        config_map = {
            "metadata": {"name": f"{name}-svc", "namespace": namespace, "ownerReferences": [_owner(job)]},
            "data": data,
        }
        if self.double.get("configmaps", namespace, f"{name}-svc") is None:
            self.double.create("configmaps", namespace, config_map)

    def _apply_policies(self, job: Obj, phase: str, pods: list[Obj]) -> None:
        meta = job["metadata"]
        expected = sum(task["replicas"] for task in job["spec"]["tasks"])
        by_task: dict[str, list[Obj]] = {}
        for pod in pods:
            by_task.setdefault(pod["metadata"]["labels"]["volcano.sh/task-spec"], []).append(pod)
        action = None
        for task in job["spec"]["tasks"]:
            members = by_task.get(task["name"], [])
            events = set()
            if len(members) == task["replicas"] and all(_phase(p) == "Succeeded" for p in members):
                events.add("TaskCompleted")
            if any(_phase(p) == "Failed" for p in members):
                events.add("PodFailed")
            if len(members) < task["replicas"] and phase != "Pending":
                events.add("PodEvicted")  # a pod of a started job was deleted
            for policy in task.get("policies") or []:
                wanted = set(policy.get("events") or []) | ({policy["event"]} if policy.get("event") else set())
                if wanted & events:
                    action = action or policy["action"]
        if action in ("CompleteJob", "TerminateJob", "AbortJob"):
            self.log.append(f"{meta['name']}: {action}")
            for pod in pods:  # PodRetainPhaseSoft: Succeeded and Failed pods are kept
                if _phase(pod) not in TERMINAL:
                    try:
                        self.double.delete("pods", meta["namespace"], pod["metadata"]["name"])
                    except ApiError:
                        pass
            final = {"CompleteJob": "Completed", "TerminateJob": "Terminated", "AbortJob": "Aborted"}[action]
            self._set_job_phase(job, final)
            return
        started = [p for p in pods if _phase(p) != "Pending"]
        if phase == "Pending" and len(started) >= min(job["spec"].get("minAvailable", expected), expected):
            self._set_job_phase(job, "Running")

    def _set_job_phase(self, job: Obj, phase: str) -> None:
        def change(j: Obj) -> None:
            status = j.setdefault("status", {})
            status["state"] = {"phase": phase, "lastTransitionTime": rfc3339(time.time())}
            status["minAvailable"] = j["spec"].get("minAvailable", 0)

        self.double.update_object(self.jobs, job["metadata"]["namespace"], job["metadata"]["name"], change)


def _owner(obj: Obj) -> Obj:
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def _env_name(task: str) -> str:
    return task.upper().replace("-", "_")


def _queue_of(pod: Obj) -> str:
    return str((pod["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL, ""))


def _ungate(pod: Obj) -> None:
    gates = [g for g in pod["spec"].get("schedulingGates") or [] if g.get("name") != KUEUE_GATE]
    if gates:
        pod["spec"]["schedulingGates"] = gates
    else:
        pod["spec"].pop("schedulingGates", None)


def _drop_finalizer(pod: Obj) -> None:
    pod["metadata"]["finalizers"] = [f for f in pod["metadata"].get("finalizers") or [] if f != KUEUE_FINALIZER]


def _pod_from_task(job: Obj, task: Obj, index: int, group_name: str) -> Obj:
    """A pod as Volcano's job controller and its svc and env plugins make it."""
    meta = job["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    template = copy.deepcopy(task["template"])
    pod_meta = template.get("metadata") or {}
    labels = {
        **(pod_meta.get("labels") or {}),
        "volcano.sh/job-name": name,
        "volcano.sh/job-namespace": namespace,
        "volcano.sh/task-spec": task["name"],
        "volcano.sh/task-index": str(index),
        "volcano.sh/queue-name": job["spec"].get("queue", "default"),
    }
    annotations = {**(pod_meta.get("annotations") or {}), VOLCANO_GROUP_ANNOTATION: group_name}
    spec = template["spec"]
    pod_name = f"{name}-{task['name']}-{index}"
    spec.update(hostname=pod_name, subdomain=name, schedulerName=job["spec"].get("schedulerName", "volcano"))
    env = [{"name": "VK_TASK_INDEX", "value": str(index)}, {"name": "VC_TASK_INDEX", "value": str(index)}]
    for other in job["spec"]["tasks"]:
        hosts = ",".join(f"{name}-{other['name']}-{i}.{name}" for i in range(other["replicas"]))
        env += [
            {"name": f"VC_{_env_name(other['name'])}_HOSTS", "value": hosts},
            {"name": f"VC_{_env_name(other['name'])}_NUM", "value": str(other["replicas"])},
        ]
    for container in spec.get("containers") or []:
        container["env"] = [*(container.get("env") or []), *env]
        container.setdefault("volumeMounts", []).append({"name": f"{name}-svc", "mountPath": "/etc/volcano"})
    spec.setdefault("volumes", []).append({"name": f"{name}-svc", "configMap": {"name": f"{name}-svc"}})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [_owner(job)],
        },
        "spec": spec,
    }
