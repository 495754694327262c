"""The Volcano Job backend's objects: one ``batch.volcano.sh/v1alpha1`` Job plus our Secret and
ConfigMap, owned by it.

Tasks ``master`` (1) and ``worker`` (N) make Volcano name the pods ``<job>-master-0`` and
``<job>-worker-<i>`` and its ``svc`` plugin give them the hosts ``<pod>.<job>``: the names the
pod contract already uses, and ``GJ_TRAINING_VC_JOB_NAME`` is the Volcano job's own name.
Only the ``svc`` and ``env`` plugins: ``ssh`` would overwrite a Secret named ``<job>-ssh`` and
mount its own keys over ``/root/.ssh``; ``mpi`` turns ``ssh`` on. Airflow owns retries, so any
failed or evicted pod terminates the job and the master's success completes it.

One pod template per task: a worker's own name comes from the downward API, and the workers
share one host key (every worker's known_hosts line pins it), since a template cannot hold
per-pod Secret items.
"""

from __future__ import annotations

from collections.abc import Collection

from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.job.plan import JobPlan, PodPlan
from airflow_mpi.kinds.base import NOT_QUEUED, Obj, QueueCheck
from airflow_mpi.kinds.controller import ControllerKind
from airflow_mpi.kinds.manifests import (
    GVK,
    PLACEHOLDER_UID,
    Manifest,
    downward_pod_name,
    owner_reference_to,
    render_config_map,
    render_pod,
    render_pod_template,
    render_secret,
    require_image,
    share_worker_host_key,
)
from airflow_mpi.observe.status import PodState
from airflow_mpi.spec import Gang

VOLCANO_JOB: GVK = ("batch.volcano.sh", "v1alpha1", "jobs", "Job")
DEFAULT_QUEUE = "default"
DEFAULT_SCHEDULER = "volcano"
PLUGINS: dict[str, list[str]] = {"svc": [], "env": []}
ENDING_EVENTS = ["PodFailed", "PodEvicted"]
# The Job's phases while it waits for the queue (no pods exist yet).
QUEUED_PHASES = frozenset({"", "Pending"})


def volcano_secret_name(job_name: str) -> str:
    """Not ``<job>-ssh`` (Volcano's ssh plugin overwrites that Secret) nor ``<job>-svc``."""
    return f"{job_name}-mpi-ssh"


def volcano_config_map_name(job_name: str) -> str:
    """Not ``<job>-svc`` (the svc plugin's hosts ConfigMap)."""
    return f"{job_name}-mpi-config"


def render_volcano_manifests(
    plan: JobPlan, namespace: str, *, owner_uid: str | None = None, redact_secrets: bool = False
) -> list[Manifest]:
    """Every object the Volcano backend creates, in order: the Job, then its Secret and ConfigMap
    (owned by the Job, so created once its uid is known)."""
    require_image(plan)
    _require_volcano_gang(plan)
    plan = share_worker_host_key(plan)
    owner = owner_reference_to(VOLCANO_JOB, plan.job_name, owner_uid or PLACEHOLDER_UID)
    secret = render_secret(plan, namespace, owner, redact=redact_secrets)
    secret["metadata"]["name"] = volcano_secret_name(plan.job_name)
    config_map = render_config_map(plan, namespace, owner)
    config_map["metadata"]["name"] = volcano_config_map_name(plan.job_name)
    return [render_volcano_job(plan, namespace), secret, config_map]


def _require_volcano_gang(plan: JobPlan) -> None:
    gang = plan.spec.scheduling.gang
    if gang is not None and gang is not Gang.VOLCANO:
        raise SpecError(
            [
                SpecIssue(
                    "scheduling.gang",
                    f"is {gang.value!r}, but the Volcano Job backend is always gang-scheduled by Volcano",
                    "leave it out (or set 'volcano') for this backend, or use the kubernetes backend",
                )
            ]
        )


def render_volcano_job(plan: JobPlan, namespace: str) -> Manifest:
    """The ``batch.volcano.sh/v1alpha1`` Job: tasks master and worker, gang of 1 + N."""
    spec, scheduling = plan.spec, plan.spec.scheduling
    master_policies: list[Manifest] = [
        {"event": "TaskCompleted", "action": "CompleteJob"},
        {"events": list(ENDING_EVENTS), "action": "TerminateJob"},
    ]
    tasks = [_task(plan, plan.master, 1, master_policies, namespace)]
    if plan.workers:
        worker_policies: list[Manifest] = [{"events": list(ENDING_EVENTS), "action": "TerminateJob"}]
        tasks.append(_task(plan, plan.workers[0], len(plan.workers), worker_policies, namespace))
    job_spec: Manifest = {
        "schedulerName": scheduling.scheduler_name or DEFAULT_SCHEDULER,
        "queue": scheduling.queue or DEFAULT_QUEUE,
        "minAvailable": len(plan.pods),
        "maxRetry": 0,
        "plugins": {name: list(args) for name, args in PLUGINS.items()},
        "tasks": tasks,
    }
    if spec.pod.priority_class:
        job_spec["priorityClassName"] = spec.pod.priority_class
    group, version, _, kind = VOLCANO_JOB
    master = render_pod(plan, plan.master, namespace, None)
    metadata = {key: master["metadata"][key] for key in ("namespace", "annotations")}
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": {"name": plan.job_name, **metadata, "labels": dict(plan.labels)},
        "spec": job_spec,
    }


def _task(plan: JobPlan, first: PodPlan, replicas: int, policies: list[Manifest], namespace: str) -> Manifest:
    return {
        "name": first.role.value,
        "replicas": replicas,
        "minAvailable": replicas,
        "maxRetry": 0,
        "policies": policies,
        "template": _template(plan, first, namespace),
    }


def _template(plan: JobPlan, first: PodPlan, namespace: str) -> Manifest:
    """A task's pod template (Volcano sets each pod's name, index and host name), every pod's
    name from the API."""
    template = render_pod_template(
        plan,
        first,
        namespace,
        secret=volcano_secret_name(plan.job_name),
        config_map=volcano_config_map_name(plan.job_name),
    )
    container = template["spec"]["containers"][0]
    container["env"] = [downward_pod_name(item) for item in container["env"]]
    return template


def without_policy_kills(states: list[PodState], deleting: Collection[str] = ()) -> list[PodState]:
    """Pod states with the pods the job's own policy deleted left out: once one pod ended by
    itself (the master's success, a rank's failure), Volcano deletes the running rest, and those
    are not what decided the job. A deleted pod is one gone (reason ``Deleted``) or one the API is
    deleting (``deleting``): a pod the policy killed shows its kill's exit code (137) until it is
    gone, and must not be named as the cause."""

    def deleted(state: PodState) -> bool:
        return state.reason == "Deleted" or state.name in deleting

    if not any(state.ended and not deleted(state) for state in states):
        return states
    return [state for state in states if not deleted(state)]


def describe_volcano_wait(job: Manifest | None) -> str | None:
    """Why a Volcano Job has no running pods yet (its PodGroup waits in the queue), or None once
    the queue admitted it (its pods exist: the pod rules apply from then on)."""
    if job is None:
        return None
    phase = ((job.get("status") or {}).get("state") or {}).get("phase", "")
    if phase not in QUEUED_PHASES:
        return None
    counts = job.get("status") or {}
    if any(counts.get(key) for key in ("pending", "running", "succeeded", "failed")):
        return None
    queue = job.get("spec", {}).get("queue", DEFAULT_QUEUE)
    return f"queued in Volcano queue {queue!r}: job {phase or 'not yet seen by the controller'}"


class VolcanoKind(ControllerKind):
    """A ``batch.volcano.sh`` Job: Volcano's controller creates the pods once its queue admits
    the whole job, and its policy deletes the other pods once one ended by itself."""

    name = "volcano"
    top_label = "Volcano job"
    top_resource = VOLCANO_JOB
    _rules = ({"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"], "verbs": ["create", "get", "list", "delete"]},)
    _trigger_rules = ({"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"], "verbs": ["get", "delete"]},)

    def render(self, plan: JobPlan, namespace: str, *, redact_secrets: bool = False) -> list[Obj]:
        """The Volcano Job, our Secret, our ConfigMap."""
        return list(render_volcano_manifests(plan, namespace, redact_secrets=redact_secrets))

    def _queue_check(self, gang: bool, queue: str | None, pods: list[Obj], top: Obj | None) -> QueueCheck:
        """Queued while the Job is Pending and none of its pods exists yet (Volcano creates them
        only once the queue admits the whole job)."""
        if pods:
            return NOT_QUEUED
        return QueueCheck(reason=describe_volcano_wait(top))

    def _observe(self, states: list[PodState], deleting: set[str]) -> list[PodState]:
        """Without the pods Volcano's policy deleted once one pod ended by itself."""
        return without_policy_kills(states, deleting)
