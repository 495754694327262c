"""Removing a job from a cluster, for every kind: delete its top object (the garbage collector
takes what it owns), wait until its pods are gone, delete directly what a slow or absent
collector left (the Secret holds the job's private key), and list what is still there.

Bounded: when the API refuses or stays silent for ``api_timeout``, the error is raised with
what to delete by hand; the caller reports it as left over.
"""

from __future__ import annotations

import contextlib
import logging
import time

from airflow_mpi.backends.core_objects import CoreObjects
from airflow_mpi.backends.custom_objects import CustomObjects
from airflow_mpi.backends.pod_watch import PodWatcher, WatchedJob
from airflow_mpi.contract import POD_TERMINATION_GRACE_SECONDS
from airflow_mpi.exceptions import BackendError
from airflow_mpi.job.naming import job_selector
from airflow_mpi.kinds.base import JobKind
from airflow_mpi.kinds.gang import KUEUE_WORKLOAD
from airflow_mpi.kinds.manifests import LOG_LEASE, SERVICE, log_lease_name
from airflow_mpi.observe.status import NODE_GONE_REASONS, pod_state_from_k8s
from airflow_mpi.spec import Gang

_log = logging.getLogger(__name__)
TEARDOWN_WAIT = 60.0  # for the pods to go once the API has accepted the delete
# After deleting the pods ourselves: the kubelet has their grace period to stop them, then a margin.
DIRECT_DELETE_WAIT = POD_TERMINATION_GRACE_SECONDS + 10.0
GC_SETTLE = 5.0  # seconds leftovers gives the garbage collector once the top object is gone


SERVICES = SERVICE[:3]  # our Service, named after the job (the ``pods`` kind's owner)


def job_deletions(kind: JobKind, custom_objects: list[tuple[str, str, str]]) -> list[tuple[tuple[str, str, str], str]]:
    """What removing a job deletes by its name, in order, each with its propagation: the kind's
    top object (with the kind's own), our Service, then the other custom objects a kill deletes
    (Kueue's Workload, a TrainJob's runtime). Both waits remove a job so: the waiting path's
    teardown (``JobRemoval``), then the deferred one's kill (``MPIJobTrigger.on_kill``), which
    stops there (its Role lists, gets and deletes nothing else: the collector takes the rest)."""
    top = kind.top_resource[:3] if kind.controller_makes_pods() else None
    first = [(top, kind.deletion_propagation())] if top is not None and top in custom_objects else []
    rest = [(resource, "Background") for resource in custom_objects if resource != top]
    return [*first, (SERVICES, "Background"), *rest]


class JobRemoval:
    """Removes jobs of one kind through the backend's clients."""

    def __init__(self, objects: CoreObjects, custom: CustomObjects, kind: JobKind) -> None:
        self.objects, self.custom, self.kind = objects, custom, kind

    def remove(self, job: WatchedJob | None, job_name: str, namespace: str) -> None:
        """Delete the job's objects (``job_deletions``: the rest goes with them) and wait until
        its pods are gone (``job``: its watch, when this process has one)."""
        plan = job.plan if job is not None else None
        top = self.kind.top_resource
        controller = self.kind.controller_makes_pods()
        custom = self.kind.custom_objects_to_delete(plan) if plan is not None else [top[:3]] if controller else []
        if plan is not None and plan.spec.scheduling.gang is Gang.KUEUE and KUEUE_WORKLOAD[:3] not in custom:
            custom.append(KUEUE_WORKLOAD[:3])  # before the wait: Kueue's finalizer holds the pods until it goes
        since = time.monotonic()
        failed: BackendError | None = None
        try:
            for resource, propagation in job_deletions(self.kind, custom):
                try:
                    if resource == SERVICES:
                        self._delete_service(namespace, job_name, since)
                    else:
                        gvk = (*resource, "")  # (group, version, plural): what a delete names
                        self.custom.delete(namespace, gvk, job_name, propagation=propagation, since=since)
                except BackendError as error:
                    if resource != KUEUE_WORKLOAD[:3]:
                        raise
                    failed = error  # the pods are still waited for: Kueue's finalizer held them
            if job is not None:
                self._wait_pods_gone(job, job_name, namespace, since)
        finally:
            if job is not None:
                job.watcher.stop()
        if failed is not None:
            raise failed
        if controller:  # foreground (as a rule): it is gone only once everything it owns is
            self.custom.wait_gone(namespace, top, job_name, TEARDOWN_WAIT)

    def _delete_service(self, namespace: str, job_name: str, since: float) -> None:
        try:
            self.objects.delete(namespace, "services", job_name, since, propagation="Background")
        except BackendError as error:
            raise type(error)(
                f"{error}; then delete the Service {job_name} in namespace {namespace} (kubectl delete service "
                f"{job_name} -n {namespace}): the job's other objects and pods go with it"
            ) from error

    def _wait_pods_gone(self, job: WatchedJob, job_name: str, namespace: str, since: float) -> None:
        """Wait for the job's pods to go; delete directly what a slow or absent collector left."""
        failed = self._force_delete_on_lost_nodes(job, job_name, namespace, since)
        left = _pods_left_after(job.watcher, TEARDOWN_WAIT)
        if left is None:  # no watch to tell: ask; if the API will not say, the collector has them
            with contextlib.suppress(BackendError):
                pods = self.objects.list(namespace, "pods", job_selector(job_name), since)
                left = [p["metadata"]["name"] for p in pods]
        job.final_pods = left or []
        if job.final_pods:
            failed = self._delete_without_collector(namespace, job_name, job.final_pods, since) or failed
            # the kubelet stops them within their grace period: wait for that, not less
            left = _pods_left_after(job.watcher, DIRECT_DELETE_WAIT)
            if left is not None:
                job.final_pods = left
        if failed is not None:
            raise failed

    def _force_delete_on_lost_nodes(
        self, job: WatchedJob, job_name: str, namespace: str, since: float
    ) -> BackendError | None:
        """A pod whose Node stopped reporting (or that the cluster evicts from a tainted Node) stays
        Terminating until that Node's kubelet confirms it, which may be never: delete it at once,
        as ``kubectl delete --force --grace-period=0`` does. Should the Node come back, its kubelet
        stops what is still running there."""
        with job.watcher.cond:
            pods = [pod_state_from_k8s(pod) for pod in job.watcher.table.pods.values()]
        # Every pod of the job on such a Node, as the API lists them now: the cluster marks them
        # one by one, and a watch may lag.
        lost = {pod.node for pod in pods if pod.reason in NODE_GONE_REASONS and pod.node}
        if lost:
            with contextlib.suppress(BackendError):
                listed = self.objects.list(namespace, "pods", job_selector(job_name), since)
                pods = [pod_state_from_k8s(pod) for pod in listed]
        failed: BackendError | None = None
        for pod in pods:
            if pod.reason not in NODE_GONE_REASONS and pod.node not in lost:
                continue
            _log.warning(
                "pod %s is on Node %s, which stopped reporting or was tainted: deleting it without waiting",
                pod.name,
                pod.node,
            )
            try:
                self.objects.delete(namespace, "pods", pod.name, since, grace_seconds=0)
            except BackendError as error:
                failed = failed or error
        return failed

    def _delete_without_collector(
        self, namespace: str, job_name: str, pods: list[str], since: float
    ) -> BackendError | None:
        """The garbage collector did not remove the job's pods in ``TEARDOWN_WAIT``: it is slow or
        not running. Delete the pods and the objects the Service owned (the Secret holds the job's
        private key) directly, and say so."""
        _log.warning(
            "the garbage collector did not delete the pods of job %s within %.0f s (is kube-controller-manager "
            "running?): deleting the job's pods, Secret, ConfigMap and Lease directly",
            job_name,
            TEARDOWN_WAIT,
        )
        failed: BackendError | None = None
        objects = [("pods", pod) for pod in pods]
        for plural in ("secrets", "configmaps"):
            with contextlib.suppress(BackendError):
                listed = self.objects.list(namespace, plural, job_selector(job_name), since)
                objects += [(plural, o["metadata"]["name"]) for o in listed]
        for plural, name in objects:
            try:
                self.objects.delete(namespace, plural, name, since)
            except BackendError as error:
                failed = failed or error
        try:
            self.custom.delete(namespace, LOG_LEASE, log_lease_name(job_name), since=since)
        except BackendError as error:
            failed = failed or error
        return failed

    def leftovers(self, job: WatchedJob | None, job_name: str, namespace: str) -> list[str]:
        """What of the job still exists, by listing: our Services, Secrets and ConfigMaps (and
        the pods the watch saw last), our Lease, then what the kind's controller made. While the top object
        is gone, what is left is given ``GC_SETTLE`` seconds: the collector takes it shortly."""
        since = time.monotonic()
        while True:
            found, top_there = self._listed(job, job_name, namespace, since)
            if not found or top_there or time.monotonic() - since >= GC_SETTLE:
                return found
            time.sleep(0.2)

    def _listed(self, job: WatchedJob | None, job_name: str, namespace: str, since: float) -> tuple[list[str], bool]:
        """Everything of the job that is listed now, and whether its top object is among it."""
        selector = job_selector(job_name)
        plurals = ("services", "secrets", "configmaps", *(("pods",) if job is None or job.final_pods else ()))
        found = [
            f"{plural[:-1]} {o['metadata']['name']}"
            for plural in plurals
            for o in self.objects.list(namespace, plural, selector, since)
        ]
        if self.custom.get(namespace, LOG_LEASE, log_lease_name(job_name), since) is not None:
            found.append(f"lease {log_lease_name(job_name)}")
        kind = self.kind
        if not kind.controller_makes_pods():  # our Service, the top object, was among what was listed
            return found, f"service {job_name}" in found
        top_there = self.custom.get(namespace, kind.top_resource, job_name) is not None
        if top_there:
            found.append(f"{kind.top_label} {job_name}")
        for left in kind.leftovers(job_name):
            if left.selector is not None:
                listed = self.objects.list(namespace, left.plural, left.selector)
                found += [f"{left.plural[:-1]} {o['metadata']['name']}" for o in listed]
            elif left.name is not None and self.objects.get(namespace, left.plural, left.name) is not None:
                found.append(f"{left.plural[:-1]} {left.name}")
        return sorted(set(found)), top_there


def _pods_left_after(watcher: PodWatcher, timeout: float) -> list[str] | None:
    """The job's pods the watch still sees after waiting up to ``timeout`` for them to go; None
    when the watch has ended (it can no longer tell)."""
    deadline = time.monotonic() + timeout
    with watcher.cond:
        while watcher.table.pods and time.monotonic() < deadline and watcher.alive:
            watcher.cond.wait(0.5)
        return list(watcher.table.pods) if watcher.alive else None
