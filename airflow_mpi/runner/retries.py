"""A retry's job: the plan a backend runs, and the job an earlier try left running (a worker
crash leaves it): reattach to the newest one that can still give the result, remove the others.

Earlier tries are looked for in the namespaces they ran in: the one the task recorded when its
earlier try began (a ``spec.pod.namespace`` template, or the connection's namespace, may give
another one now) and the one this try's spec gives. Only jobs of this task instance of this
deployment are found (their run key), and each is removed in its own namespace.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from airflow_mpi.backends.base import Backend, FoundJob, PlanningBackend, ReattachableBackend
from airflow_mpi.exceptions import JobNotFound
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.observe.status import JobPhase, evaluate_job
from airflow_mpi.spec import MPIJobSpec

log = logging.getLogger(__name__)


def plan_for(backend: Backend, spec: MPIJobSpec, identity: RunIdentity) -> JobPlan:
    """The job's plan as ``backend`` runs it (a controller may fix the master's name and paths)."""
    if isinstance(backend, PlanningBackend):
        return backend.render_plan(spec, identity)
    return render_plan(spec, identity)


def find_earlier_jobs(
    backend: ReattachableBackend, spec: MPIJobSpec, identity: RunIdentity, namespaces: Iterable[str]
) -> list[FoundJob]:
    """The jobs of every try of this task instance in ``namespaces`` (the ones earlier tries
    recorded) and in the namespace this spec gives, newest try first."""
    found: dict[tuple[str, str], FoundJob] = {}
    current = backend.namespace_for(spec)
    for namespace in dict.fromkeys([*namespaces, current]):
        try:
            jobs = backend.find_jobs(identity, namespace)
        except JobNotFound:
            if namespace == current:
                raise  # this try's own namespace: its create would fail the same way
            log.info("namespace %s, where an earlier try ran, is gone: nothing of it to remove", namespace)
            continue
        for job in jobs:
            found[(job.namespace, job.job_name)] = job
    return sorted(found.values(), key=lambda job: job.try_number, reverse=True)


def resume_or_clean(
    backend: Backend, spec: MPIJobSpec, identity: RunIdentity, namespaces: Iterable[str] = ()
) -> JobPlan | None:
    """On a retry, find the jobs earlier tries of this task instance left (a worker crash leaves
    its job running), in ``namespaces`` (where earlier tries recorded they ran) and in this
    spec's. Reattach to the newest one that can still give the result (its master runs or has
    ended); remove every other one, where it is. Never leaves two jobs for one task."""
    if not isinstance(backend, ReattachableBackend) or identity.try_number <= 1:
        return None
    adopted: JobPlan | None = None
    for found in find_earlier_jobs(backend, spec, identity, namespaces):
        # The plan says where the job is: the operator's link, the deferral and the teardown use it.
        where = dataclasses.replace(spec, pod=dataclasses.replace(spec.pod, namespace=found.namespace))
        earlier = plan_for(backend, where, dataclasses.replace(identity, try_number=found.try_number))
        if adopted is None and found.try_number != identity.try_number and earlier.job_name == found.job_name:
            states = backend.adopt(earlier, found.namespace)
            status = evaluate_job(states)
            master_there = any(state.name == earlier.master.name for state in states)
            master_failed = status.phase is JobPhase.FAILED and status.failed_pod == earlier.master.name
            if master_there and (status.phase in (JobPhase.RUNNING, JobPhase.SUCCEEDED) or master_failed):
                log.info("reattaching to job %s of try %d", found.job_name, found.try_number)
                adopted = earlier
                continue
        log.info("removing job %s left by try %d in namespace %s", found.job_name, found.try_number, found.namespace)
        left = backend.remove_found(found)
        if left:
            log.error("removing %s left: %s", found.job_name, "; ".join(left))
    return adopted
