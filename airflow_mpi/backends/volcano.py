"""Volcano Job backend: one ``batch.volcano.sh/v1alpha1`` Job per MPI job (``airflow-mpi render
--backend volcano`` prints it), gang-scheduled and queued by Volcano.

Volcano's controller creates the pods (master and workers at once, once the queue admits the
job) and the headless Service; we create the Job, then our Secret and ConfigMap owned by it.
From there this is the Kubernetes backend: the same pod watch (by our job label, which the pod
templates carry), readiness, master log follow and failure causes. Success is the master's
(phase ``Completed`` follows from it); teardown deletes the Job, whose owner references take
everything else along.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

from airflow_mpi.backends.base import FoundJob
from airflow_mpi.backends.custom_objects import find_custom_jobs
from airflow_mpi.backends.kubernetes import TEARDOWN_WAIT, KubernetesBackend, Obj
from airflow_mpi.exceptions import LaunchError
from airflow_mpi.naming import RunIdentity, job_selector
from airflow_mpi.plan import JobPlan
from airflow_mpi.spec import Role
from airflow_mpi.status import PodState
from airflow_mpi.volcano import (
    VOLCANO_JOB,
    describe_volcano_wait,
    render_volcano_manifests,
    render_volcano_owner_reference,
    without_policy_kills,
)


class VolcanoBackend(KubernetesBackend):
    """The Kubernetes backend with Volcano's job controller creating the pods."""

    name = "volcano"
    # Its Role (README) grants its custom resources too; not checked before create yet: each
    # request's own 403 names a missing verb.
    required_permissions = ()
    top_owner = (f"{VOLCANO_JOB[0]}/{VOLCANO_JOB[1]}", VOLCANO_JOB[3])

    def create(self, plan: JobPlan) -> None:
        namespace = self.namespace_for(plan.spec)
        volcano_job, secret, config_map = render_volcano_manifests(plan, namespace)
        if self.custom.get(namespace, VOLCANO_JOB, plan.job_name) is not None:
            # An earlier attempt of this very try: start clean (its pods may be half-way).
            self._delete_volcano_job(namespace, plan.job_name)
        created = self.custom.create(namespace, VOLCANO_JOB, volcano_job)
        owner = render_volcano_owner_reference(plan, created["metadata"]["uid"])
        job = self._watch(plan, namespace, created["metadata"]["resourceVersion"])
        job.roles[plan.master.name] = Role.MASTER  # Volcano creates it with the workers
        try:
            for obj, plural in ((secret, "secrets"), (config_map, "configmaps")):
                obj["metadata"]["ownerReferences"] = [owner]
                self._create(namespace, plural, obj)
        except BaseException:
            with contextlib.suppress(Exception):  # the create's own error is the one to raise
                self.teardown(plan.job_name, namespace)
            raise

    def starts_master_with_workers(self, plan: JobPlan) -> bool:
        return True

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        return [VOLCANO_JOB[:3]]

    def start_master(self, job_name: str) -> None:
        """Nothing to do: Volcano starts the master with the workers; its launch script waits
        for their sshd."""
        self._job(job_name).roles.setdefault(self._job(job_name).master, Role.MASTER)

    def pod_states(self, job_name: str) -> list[PodState]:
        return without_policy_kills(super().pod_states(job_name))

    def queue_status(self, job_name: str) -> str | None:
        """Queued while the Job is Pending and none of its pods exists yet (Volcano creates them
        only once the queue admits the whole job)."""
        job = self._job(job_name)
        with job.watcher.cond:
            if job.watcher.table.pods:
                return None
        return describe_volcano_wait(self.custom.get(job.namespace, VOLCANO_JOB, job_name))

    def teardown(self, job_name: str, namespace: str | None = None) -> None:
        """Delete the Volcano Job (its pods, Service, PodGroup, our Secret and ConfigMap go with
        it) and wait until its pods are gone."""
        job = self._jobs.get(job_name)
        namespace = job.namespace if job else namespace or self._namespace or "default"
        # Foreground: the Job is gone only once everything it owns is.
        self.custom.delete(namespace, VOLCANO_JOB, job_name, propagation="Foreground")
        super().teardown(job_name, namespace)  # waits for the pods; its Service delete finds none
        self.custom.wait_gone(namespace, VOLCANO_JOB, job_name, TEARDOWN_WAIT)

    def _delete_volcano_job(self, namespace: str, name: str) -> None:
        self.custom.delete(namespace, VOLCANO_JOB, name, propagation="Foreground")
        if not self.custom.wait_gone(namespace, VOLCANO_JOB, name, 60):
            raise LaunchError(f"Volcano job {name}: an earlier attempt's job is still being deleted")

    def leftovers(self, job_name: str) -> list[str]:
        job = self._jobs.get(job_name)
        namespace = job.namespace if job else self._namespace or "default"
        found = super().leftovers(job_name)
        if self.custom.get(namespace, VOLCANO_JOB, job_name) is not None:
            found.append(f"Volcano job {job_name}")
        found += [f"pod {p['metadata']['name']}" for p in self._list(namespace, "pods", job_selector(job_name))]
        return sorted(set(found))

    def find_jobs(self, identity: RunIdentity, namespace: str) -> list[FoundJob]:
        """Volcano Jobs of every try of this task instance (they carry the run labels)."""
        return find_custom_jobs(self.custom, namespace, VOLCANO_JOB, identity)

    def job_exists(self, job_name: str, namespace: str) -> bool:
        return self.custom.get(namespace, VOLCANO_JOB, job_name) is not None

    def job_pod_states(self, pods: list[Obj]) -> list[PodState]:
        """Without the pods Volcano's policy is deleting once one pod ended by itself (a listed
        pod being deleted counts as deleted, as the watch sees it a moment later)."""
        states = super().job_pod_states(pods)
        return without_policy_kills(
            [
                replace(state, reason="Deleted") if pod["metadata"].get("deletionTimestamp") else state
                for pod, state in zip(pods, states, strict=True)
            ]
        )
