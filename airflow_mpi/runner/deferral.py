"""What a deferring operator hands its trigger: the ``WaitContract`` for the job a runner
created, from its plan, its marks and the backend it runs on. One place, so the operator, the
benchmarks and the tests defer alike."""

from __future__ import annotations

from airflow_mpi.backends.base import DeferrableBackend, QueueAwareBackend
from airflow_mpi.events import WaitContract
from airflow_mpi.observe.master_output import OutputPlan
from airflow_mpi.runner.job import JobRunner


def wait_contract(runner: JobRunner, backend: DeferrableBackend, now: float) -> WaitContract:
    """The trigger waits for the end: it shows the master's lines live after those this try's
    log holds (a reattached retry's earlier try showed them) and bounds the workers' start by
    ``startup_timeout`` (the master started beside them)."""
    plan, spec = runner.plan, runner.plan.spec
    custom = backend.custom_objects_to_delete(plan) if isinstance(backend, QueueAwareBackend) else []
    return WaitContract(
        job_name=plan.job_name,
        namespace=backend.namespace_for(spec),
        kubernetes_conn_id=backend.kubernetes_conn_id,
        deadline=now + spec.timeout,
        timeout=spec.timeout,
        master_pod=plan.master.name,
        worker_pods=tuple(worker.name for worker in plan.workers),
        api_timeout=backend.api_timeout,
        kind=backend.kind.name,
        ssh_port=spec.ssh_port,
        try_number=plan.identity.try_number,
        marks=dict(runner.marks),
        gang=spec.scheduling.gang is not None,
        queue=spec.scheduling.queue,
        queue_timeout=spec.scheduling.queue_timeout,
        created_at=runner.marks.get("created"),
        custom_objects=tuple((group, version, plural) for group, version, plural in custom),
        master_log=OutputPlan.from_plan(plan).to_dict(),
        skip_lines=runner.master_output.skip_lines,
        startup_timeout=spec.startup_timeout if plan.workers else None,
    )
