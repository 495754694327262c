"""A retry's job: the plan a backend runs, and the job an earlier try left running (a worker
crash leaves it): reattach to the newest one that can still give the result, remove the others.
"""

from __future__ import annotations

import dataclasses
import logging

from airflow_mpi.backends.base import Backend, PlanningBackend, ReattachableBackend
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


def resume_or_clean(backend: Backend, spec: MPIJobSpec, identity: RunIdentity) -> JobPlan | None:
    """On a retry, find the jobs earlier tries of this task instance left (a worker crash leaves
    its job running). Reattach to the newest one that can still give the result (its master runs
    or has ended); remove every other one. Never leaves two jobs for one task."""
    if not isinstance(backend, ReattachableBackend) or identity.try_number <= 1:
        return None
    namespace = backend.namespace_for(spec)
    adopted: JobPlan | None = None
    for found in sorted(backend.find_jobs(identity, namespace), key=lambda job: job.try_number, reverse=True):
        earlier = plan_for(backend, spec, dataclasses.replace(identity, try_number=found.try_number))
        if adopted is None and found.try_number != identity.try_number and earlier.job_name == found.job_name:
            states = backend.adopt(earlier, namespace)
            status = evaluate_job(states)
            master_there = any(state.name == earlier.master.name for state in states)
            master_failed = status.phase is JobPhase.FAILED and status.failed_pod == earlier.master.name
            if master_there and (status.phase in (JobPhase.RUNNING, JobPhase.SUCCEEDED) or master_failed):
                log.info("reattaching to job %s of try %d", found.job_name, found.try_number)
                adopted = earlier
                continue
        log.info("removing job %s left by try %d", found.job_name, found.try_number)
        backend.teardown(found.job_name)
        left = backend.leftovers(found.job_name)
        if left:
            log.error("removing %s left: %s", found.job_name, "; ".join(left))
    return adopted
