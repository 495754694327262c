"""Creating a job's objects on a cluster, for every kind, so that a failure part-way leaves
nothing: the ``pods`` kind's Service first (the owner of everything else), then our Secret,
ConfigMap and the Lease of the live log's mark, then a gang's PodGroup, then the worker and
master pods concurrently (the master's launch script waits for the workers' sshd); a
controller's kind's top object and our Secret, ConfigMap and Lease made its dependents (the
Lease after the top object: no pod needs it). An earlier attempt of the same try is removed
first; a create that fails tears down what it made. An object found under the job's name that
another job owns (``identity.owned_by``) is never deleted: the create fails with
``JobNameTaken``, naming both owners.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_mpi.backends.core_objects import AlreadyExists, CoreObjects
from airflow_mpi.backends.custom_objects import CustomObjects
from airflow_mpi.backends.pod_watch import WatchedJob
from airflow_mpi.backends.removal import TEARDOWN_WAIT
from airflow_mpi.exceptions import BackendUnreachable, JobNameTaken, LaunchError
from airflow_mpi.job.identity import RunIdentity, owned_by, render_name_taken
from airflow_mpi.job.naming import job_selector
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.base import JobKind
from airflow_mpi.kinds.gang import POD_GROUP_KINDS
from airflow_mpi.kinds.manifests import LOG_LEASE, config_map_name, log_lease_name, render_log_lease, secret_name
from airflow_mpi.spec import Role

Obj = dict[str, Any]
TOP_REFUSED_WAIT = 15.0  # seconds a refusal that passes by itself (JobKind.refused_for_now) is retried


class JobCreation:
    """Creates jobs of one kind. ``watch(plan, namespace, resource_version)`` starts the job's pod
    watch (from the version of its first object, so no pod event is missed); ``remove(job_name,
    namespace)`` tears down what a failed create made."""

    def __init__(
        self,
        objects: CoreObjects,
        custom: CustomObjects,
        kind: JobKind,
        concurrency: int,
        watch: Callable[[JobPlan, str, str], WatchedJob],
        remove: Callable[[str, str], None],
    ) -> None:
        self.objects, self.custom, self.kind, self.concurrency = objects, custom, kind, concurrency
        self.watch, self.remove = watch, remove

    def create(self, plan: JobPlan, namespace: str) -> None:
        if self.kind.controller_makes_pods():
            self._create_custom_job(plan, namespace)
        else:
            self._create_pods_job(plan, namespace)

    def _create_pods_job(self, plan: JobPlan, namespace: str) -> None:
        manifests = self.kind.render(plan, namespace)
        try:
            service = self._create_service(namespace, manifests[0], plan.identity)
            owner = self.kind.owner_reference(plan, service["metadata"]["uid"])
            # Watch from the Service's version: every event of the pods created next is seen.
            job = self.watch(plan, namespace, service["metadata"]["resourceVersion"])
            for manifest in manifests[1:]:
                manifest["metadata"]["ownerReferences"] = [owner]
            secret, config_map, *rest = manifests[1:]
            self.objects.create(namespace, "secrets", secret)
            self.objects.create(namespace, "configmaps", config_map)
            self._create_log_lease(plan, namespace, owner)
            self._create_all_pods(namespace, job, rest)
        except BaseException as error:
            # Even a create that timed out may have been applied. Not when the API has just been
            # silent for the whole bound, though: the caller's teardown (bounded) tries that again.
            # Nor when the name is another job's: nothing was created, and nothing of it may go.
            if not isinstance(error, BackendUnreachable | JobNameTaken):
                with contextlib.suppress(Exception):  # the create's own error is the one to raise
                    self.remove(plan.job_name, namespace)
                # A refused pod (e.g. by PodSecurity admission) leaves no pod for teardown to wait
                # on: delete the Secret and ConfigMap now rather than at the garbage collector's pace.
                ours = (("secrets", secret_name(plan.job_name)), ("configmaps", config_map_name(plan.job_name)))
                for plural, name in ours:
                    with contextlib.suppress(Exception):
                        self.objects.delete(namespace, plural, name)
                with contextlib.suppress(Exception):
                    self.custom.delete(namespace, LOG_LEASE, log_lease_name(plan.job_name))
            raise

    def _create_log_lease(self, plan: JobPlan, namespace: str, owner: Obj) -> None:
        """The Lease a deferred job's trigger keeps its shown mark on, owned like the rest; one an
        earlier attempt left (its owner deleted in the background) is replaced: its count is not
        this job's."""
        lease = render_log_lease(plan, namespace, owner)
        try:
            self.custom.create(namespace, LOG_LEASE, lease)
        except AlreadyExists:
            self.custom.delete(namespace, LOG_LEASE, lease["metadata"]["name"])
            self.custom.create(namespace, LOG_LEASE, lease)

    def _create_pods(self, namespace: str, pods: list[Obj]) -> None:
        if pods:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(pods))) as pool:
                for _ in pool.map(lambda pod: self.objects.create(namespace, "pods", pod), pods):
                    pass  # keep none of the (large) responses

    def _create_all_pods(self, namespace: str, job: WatchedJob, objects: list[Obj]) -> None:
        """A gang's PodGroup, then the master with the workers, at once: the master's launch
        script waits for the workers' sshd itself, so mpiexec starts as soon as the last one
        answers (a gang waits until all its pods exist)."""
        gang = job.plan.spec.scheduling.gang if job.plan else None
        for group in (obj for obj in objects if obj["kind"] != "Pod"):
            if gang in POD_GROUP_KINDS:
                self.custom.create(namespace, POD_GROUP_KINDS[gang], group)
        job.roles[job.master] = Role.MASTER
        self._create_pods(namespace, [obj for obj in objects if obj["kind"] == "Pod"])

    def _create_service(self, namespace: str, manifest: Obj, identity: RunIdentity) -> Obj:
        name = manifest["metadata"]["name"]
        for _ in range(3):
            try:
                return self.objects.create(namespace, "services", manifest)
            except AlreadyExists as taken:
                existing = taken.existing or self.objects.get(namespace, "services", name)
                if existing is None:
                    continue  # gone since: create again
                check_owner("Service", existing, namespace, identity, taken)
                # A Service of this very try is there: an earlier attempt of it.
                self.objects.delete(namespace, "services", name, propagation="Foreground")
                deadline = time.monotonic() + TEARDOWN_WAIT
                while self.objects.get(namespace, "services", name) is not None and time.monotonic() < deadline:
                    time.sleep(0.5)
        raise LaunchError(f"job {name}: an earlier attempt's objects are still being deleted")

    def _create_custom_job(self, plan: JobPlan, namespace: str) -> None:
        """The top object and the objects the kind makes beside it (our Secret and ConfigMap, a
        TrainJob's runtime), made its dependents: created after it, owned from the start, or
        (``made_before_top``: never a Secret) before it and then given their owner."""
        kind, top = self.kind, self.kind.top_resource
        top_object, *ours = kind.render(plan, namespace)
        earlier = self.custom.get(namespace, top, plan.job_name)
        if earlier is not None:
            check_owner(kind.top_label, earlier, namespace, plan.identity)
            self._delete_earlier_attempt(namespace, plan.job_name)  # its pods may be half-way
        made: list[Obj] = []  # created before the top object: not owned until replaced
        created_ours: list[Obj] = []
        created: Obj | None = None
        try:
            for obj in (obj for obj in ours if kind.made_before_top(obj)):
                obj["metadata"].pop("ownerReferences", None)
                made.append(self._create_fresh(namespace, obj, plan.identity))
                created_ours.append(obj)
            created = self._create_top(namespace, top_object, plan.identity)
            job = self.watch(plan, namespace, created["metadata"]["resourceVersion"])
            job.roles[plan.master.name] = Role.MASTER  # the controller creates it with the workers
            owner = kind.owner_reference(plan, created["metadata"]["uid"])
            for obj in (obj for obj in ours if not kind.made_before_top(obj)):
                obj["metadata"]["ownerReferences"] = [owner]
                self._create_fresh(namespace, obj, plan.identity)  # another job's by its name: refused
                created_ours.append(obj)  # only once made: a name another job holds stays its own
            for obj in made:
                obj["metadata"]["ownerReferences"] = [owner]
                self._replace(namespace, obj)
            self._create_log_lease(plan, namespace, owner)
        except BaseException as error:
            # A name taken before our top object existed: the top object by this name is another job's.
            if created is not None or not isinstance(error, JobNameTaken):
                with contextlib.suppress(Exception):  # the create's own error is the one to raise
                    self.remove(plan.job_name, namespace)
            for obj in created_ours:  # not owned yet, or the collector is slow: now
                with contextlib.suppress(Exception):
                    self._delete(namespace, obj)
            if created is not None:  # made after our top object only
                with contextlib.suppress(Exception):
                    self.custom.delete(namespace, LOG_LEASE, log_lease_name(plan.job_name))
            raise

    def _create_top(self, namespace: str, manifest: Obj, identity: RunIdentity) -> Obj:
        """Create the top object; a refusal the kind knows to pass by itself (a webhook whose cache
        has not seen the objects made just before) is tried again for up to ``TOP_REFUSED_WAIT``."""
        deadline, pause = time.monotonic() + TOP_REFUSED_WAIT, 0.2
        while True:
            try:
                return self.custom.create(namespace, self.kind.top_resource, manifest)
            except AlreadyExists as taken:  # made since it was looked for
                if taken.existing is not None:
                    check_owner(self.kind.top_label, taken.existing, namespace, identity, taken)
                raise
            except LaunchError as error:
                if not self.kind.refused_for_now(str(error)) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def _create(self, namespace: str, manifest: Obj) -> Obj:
        resource = self.kind.dependent_resource(manifest)
        if resource[0]:
            return self.custom.create(namespace, resource, manifest)
        return self.objects.create(namespace, resource[2], manifest)

    def _replace(self, namespace: str, obj: Obj) -> None:
        resource = self.kind.dependent_resource(obj)
        if resource[0]:
            self.custom.replace(namespace, resource, obj)
        else:
            self.objects.replace(namespace, resource[2], obj)

    def _delete(self, namespace: str, obj: Obj) -> None:
        resource, name = self.kind.dependent_resource(obj), obj["metadata"]["name"]
        if resource[0]:
            self.custom.delete(namespace, resource, name)
        else:
            self.objects.delete(namespace, resource[2], name)

    def _create_fresh(self, namespace: str, manifest: Obj, identity: RunIdentity) -> Obj:
        """Create; one left by an attempt of this try that died before its top object existed
        is replaced (another job's is not)."""
        try:
            return self._create(namespace, manifest)
        except AlreadyExists as taken:
            if taken.existing is not None:
                check_owner(manifest["kind"], taken.existing, namespace, identity, taken)
            self._delete(namespace, manifest)
            return self._create(namespace, manifest)

    def _delete_earlier_attempt(self, namespace: str, name: str) -> None:
        """Delete it and wait until it and its pods are gone (a top object deleted in the
        background goes before its pods: the new one's would meet them)."""
        top, label = self.kind.top_resource, self.kind.top_label
        self.custom.delete(namespace, top, name, propagation=self.kind.deletion_propagation())
        deadline = time.monotonic() + TEARDOWN_WAIT
        gone = self.custom.wait_gone(namespace, top, name, TEARDOWN_WAIT)
        while gone and self.objects.list(namespace, "pods", job_selector(name)):
            if time.monotonic() >= deadline:
                gone = False
                break
            time.sleep(0.5)
        if not gone:
            raise LaunchError(f"{label} {name}: an earlier attempt's {label} is still being deleted")


def check_owner(what: str, found: Obj, namespace: str, identity: RunIdentity, cause: Exception | None = None) -> None:
    """Raise ``JobNameTaken`` (naming both owners) unless ``found`` is this very try's own."""
    meta = found.get("metadata") or {}
    if owned_by(identity, meta.get("labels")):
        return
    name, labels, annotations = meta.get("name", "?"), meta.get("labels"), meta.get("annotations")
    raise JobNameTaken(render_name_taken(what, name, namespace, identity, labels, annotations)) from cause
