"""The TrainJob kind: a Kubeflow Trainer v2 ``trainer.kubeflow.org/v1alpha1`` TrainJob, run by
the Trainer controller as a JobSet (the JobSet controller makes one Indexed batch Job per
replicated job; the Job controller makes the pods).

Each job brings its own ``TrainingRuntime`` named after it, with no ``mlPolicy``: Trainer's MPI
policy would write its own keys, hostfile and ``OMPI_MCA_*`` env into the pods, and a runtime's
``trainer`` overrides reach one container only, so a shared runtime could not carry our workers'
command, env or image. Without an ML policy Trainer copies the runtime's JobSet template whole,
and the pod contract stays ours: our Secret (keys, pinned host keys), our ConfigMap (launch
script, hostfile), our env. The runtime is snapshotted by Trainer at the first reconcile, so it
only has to exist before the TrainJob, which then owns it; our Secret and ConfigMap are created
after the TrainJob, owned by it from the start.

Names (``<job>`` = the TrainJob's name): replicated jobs ``master`` (1 pod) and ``worker`` (N);
Jobs ``<job>-master-0`` and ``<job>-worker-0``; the pods' host names (their plan names)
``<job>-master-0-0`` and ``<job>-worker-0-<i>``, resolving as ``<host>.<job>`` through JobSet's
headless Service ``<job>``; the pods themselves are ``<host>-<random>``. Once the master's Job
ends, JobSet deletes the Jobs still running (the workers after a success, the master after a
worker's failure): their pods are not what decided the job. Airflow owns retries: every Job has
``backoffLimit: 0`` and ``restartPolicy: Never``, and the JobSet no failure policy.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_mpi.contract import DEADLINE_GRACE_SECONDS, MAX_DNS_LABEL
from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.job.naming import RunIdentity, build_job_name
from airflow_mpi.job.plan import JobPlan, PodPlan, render_plan
from airflow_mpi.kinds.base import Leftover, Obj, top_condition
from airflow_mpi.kinds.controller import ControllerKind
from airflow_mpi.kinds.gang import KUEUE_QUEUE_LABEL
from airflow_mpi.kinds.manifests import (
    GVK,
    PLACEHOLDER_UID,
    Manifest,
    config_map_name,
    downward_pod_name,
    owner_reference_to,
    render_config_map,
    render_pod,
    render_pod_template,
    render_secret,
    require_image,
    secret_name,
    share_worker_host_key,
)
from airflow_mpi.spec import Gang, MPIJobSpec, Role

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
TRAINJOB: GVK = (GROUP, VERSION, "trainjobs", "TrainJob")
TRAINING_RUNTIME: GVK = (GROUP, VERSION, "trainingruntimes", "TrainingRuntime")
MASTER_JOB, WORKER_JOB = "master", "worker"  # the runtime's replicated jobs
# JobSet's labels on every Job and pod it makes.
LABEL_JOBSET = "jobset.sigs.k8s.io/jobset-name"
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
# Volcano's queue, read by Trainer's Volcano plugin from the runtime template's annotations.
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"


def master_host_name(job_name: str) -> str:
    """The master's host name: JobSet's Job ``<job>-master-0``, index 0."""
    return f"{job_name}-{MASTER_JOB}-0-0"


def worker_host_name(job_name: str, index: int) -> str:
    """Worker ``index``'s host name: JobSet's Job ``<job>-worker-0``, index ``index``."""
    return f"{job_name}-{WORKER_JOB}-0-{index}"


def master_selector(job_name: str) -> str:
    """JobSet's selector for the master's pods (the newest is the one that counts)."""
    return f"{LABEL_JOBSET}={job_name},{LABEL_REPLICATED_JOB}={MASTER_JOB}"


def render_trainjob_plan(
    spec: MPIJobSpec, identity: RunIdentity, *, platform_env: Mapping[str, str] | None = None
) -> JobPlan:
    """The plan of a job run as a TrainJob: pods named by their JobSet host names; SpecError for
    what Trainer or JobSet would refuse, before anything is created."""
    job_name = build_job_name(spec.name, identity)
    plan = render_plan(
        spec,
        identity,
        master_pod=master_host_name(job_name),
        worker_pod=lambda index: worker_host_name(job_name, index),
        platform_env=platform_env,
    )
    issues = check_trainjob_plan(plan)
    if issues:
        raise SpecError(issues)
    return plan


def check_trainjob_plan(plan: JobPlan) -> list[SpecIssue]:
    """What a TrainJob cannot be beyond what every job's spec is checked for (its name already
    starts with a letter, as Trainer's schema wants): a host name JobSet's Indexed Jobs cannot give
    a pod, one over a DNS label's 63 characters (JobSet would only say so in an event)."""
    if plan.master.name != master_host_name(plan.job_name):
        raise ValueError("a TrainJob is rendered from render_trainjob_plan's plan (master <job>-master-0-0)")
    issues = []
    longest = max((pod.name for pod in plan.pods), key=len)
    if len(longest) > MAX_DNS_LABEL:
        issues.append(
            SpecIssue(
                "name",
                f"makes the host name {longest!r} ({len(longest)} characters), over the {MAX_DNS_LABEL} a pod's "
                "host name may have",
                f"shorten name by {len(longest) - MAX_DNS_LABEL} characters",
            )
        )
    return issues


def render_trainjob_manifests(
    plan: JobPlan, namespace: str, *, owner_uid: str | None = None, redact_secrets: bool = False
) -> list[Manifest]:
    """Every object the TrainJob backend creates: the TrainJob, our Secret and our ConfigMap
    (created right after it, owned by it) and the job's TrainingRuntime (created before it, then
    owned by it)."""
    require_image(plan)
    issues = check_trainjob_plan(plan)
    if issues:
        raise SpecError(issues)
    plan = share_worker_host_key(plan)
    owner = owner_reference_to(TRAINJOB, plan.job_name, owner_uid or PLACEHOLDER_UID)
    return [
        render_trainjob(plan, namespace),
        render_secret(plan, namespace, owner, redact=redact_secrets),
        render_config_map(plan, namespace, owner),
        render_training_runtime(plan, namespace, owner),
    ]


def render_trainjob(plan: JobPlan, namespace: str) -> Manifest:
    """The TrainJob: its own runtime, no ``trainer`` (the runtime's template is the whole job),
    a deadline behind the job's own timeout, Kueue's queue label when it queues the job."""
    spec = plan.spec
    labels = dict(plan.labels)
    if spec.scheduling.queue and spec.scheduling.gang in (None, Gang.KUEUE):
        labels[KUEUE_QUEUE_LABEL] = spec.scheduling.queue  # Kueue's TrainJob integration
    master = render_pod(plan, plan.master, namespace, None)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {
            "name": plan.job_name,
            "namespace": namespace,
            "labels": labels,
            "annotations": dict(master["metadata"]["annotations"]),
        },
        "spec": {
            "runtimeRef": {"name": plan.job_name, "apiGroup": GROUP, "kind": "TrainingRuntime"},
            # Counted from creation (or from Kueue's admission): the startup wait is in it.
            "activeDeadlineSeconds": spec.startup_timeout + spec.timeout + DEADLINE_GRACE_SECONDS,
        },
    }


def render_training_runtime(plan: JobPlan, namespace: str, owner: Manifest) -> Manifest:
    """The job's TrainingRuntime: a JobSet of the replicated jobs ``master`` and ``worker``, with
    what JobSet's own webhook would default written out (its controller needs ``network`` and
    ``successPolicy``, and the webhook may not be installed)."""
    scheduling = plan.spec.scheduling
    replicated = [_replicated_job(plan, plan.master, 1, namespace)]
    if plan.workers:
        replicated.append(_replicated_job(plan, plan.workers[0], len(plan.workers), namespace))
    metadata: Manifest = {"labels": dict(plan.labels)}
    if scheduling.gang is Gang.VOLCANO and scheduling.queue:
        metadata["annotations"] = {VOLCANO_QUEUE_ANNOTATION: scheduling.queue}
    runtime_spec: Manifest = {
        "template": {
            "metadata": metadata,
            "spec": {
                # <host>.<job> resolves from the pod's start: the launch script waits for sshd itself.
                "network": {"enableDNSHostnames": True, "subdomain": plan.job_name, "publishNotReadyAddresses": True},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": [MASTER_JOB]},
                "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
                "replicatedJobs": replicated,
            },
        }
    }
    if scheduling.gang is Gang.VOLCANO:
        runtime_spec["podGroupPolicy"] = {"volcano": {}}
    elif scheduling.gang is Gang.COSCHEDULING:
        runtime_spec["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": plan.spec.startup_timeout}}
    metadata_out: Manifest = {
        "name": plan.job_name,
        "namespace": namespace,
        "labels": dict(plan.labels),
        "ownerReferences": [owner],
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRuntime",
        "metadata": metadata_out,
        "spec": runtime_spec,
    }


def _replicated_job(plan: JobPlan, first: PodPlan, pods: int, namespace: str) -> Manifest:
    template = render_pod_template(
        plan,
        first,
        namespace,
        secret=secret_name(plan.job_name),
        config_map=config_map_name(plan.job_name),
    )
    scheduler = plan.spec.scheduling.scheduler_for(plan.spec.scheduling.gang)
    if scheduler:
        template["spec"]["schedulerName"] = scheduler
    if first.role is Role.WORKER:  # one template for every worker: each pod's own name from the API
        container = template["spec"]["containers"][0]
        container["env"] = [downward_pod_name(item) for item in container["env"]]
    name = MASTER_JOB if first.role is Role.MASTER else WORKER_JOB
    return {
        "name": name,
        "replicas": 1,
        "template": {
            "metadata": {"labels": dict(template["metadata"]["labels"])},
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "backoffLimit": 0,  # Airflow owns retries
                "template": template,
            },
        },
    }


# --- the TrainJob's status -----------------------------------------------------------------------


def describe_trainjob_wait(trainjob: Manifest | None) -> str | None:
    """Why a TrainJob has no pods yet (suspended until Kueue admits it, no JobSet yet, or its
    Jobs have not made pods), or None once it ended or is not there."""
    if trainjob is None or top_condition(trainjob, "Complete") or top_condition(trainjob, "Failed"):
        return None
    if top_condition(trainjob, "Suspended") is not None:
        queue = (trainjob.get("metadata", {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
        where = f" in queue {queue!r}" if queue else ""
        return f"queued: TrainJob suspended{where} until it is admitted"
    if not (trainjob.get("status") or {}).get("jobsStatus"):
        return "queued: TrainJob not yet run as a JobSet by the Trainer and JobSet controllers"
    return "queued: TrainJob's JobSet created, its Jobs have not created pods yet"


class TrainJobKind(ControllerKind):
    """A Kubeflow Trainer v2 TrainJob with a TrainingRuntime of its own: Trainer makes a JobSet,
    JobSet one Indexed Job per role, and those the pods; the master is its Job's newest pod."""

    name = "trainjob"
    top_label = "TrainJob"
    top_resource = TRAINJOB
    _master_generated = True
    _rules = (
        {"apiGroups": [GROUP], "resources": ["trainjobs"], "verbs": ["create", "get", "list", "delete"]},
        # Made before the TrainJob (Trainer reads it at once), then given it as its owner.
        {"apiGroups": [GROUP], "resources": ["trainingruntimes"], "verbs": ["create", "get", "update", "delete"]},
    )
    _trigger_rules = (
        {"apiGroups": [GROUP], "resources": ["trainjobs"], "verbs": ["get", "delete"]},
        {"apiGroups": [GROUP], "resources": ["trainingruntimes"], "verbs": ["delete"]},
    )
    # Trainer says why it cannot make the JobSet only in this event.
    _refusal_event = "TrainJobResourcesCreationFailed"
    _refused_by = "Trainer could not run"
    # Trainer reads a runtime made just before its TrainJob from its cache, and requeues the
    # TrainJob with back-off until the cache has it (its TrainJob reconciler).
    _retried_refusals = ("TrainingRuntime specified in TrainJob is not found",)
    _silence = (
        "TrainJob {job}: no JobSet status and no pods in {waited:.0f}s: install Kubeflow Trainer "
        "v2.3 or later and JobSet, or check that both controllers are running and watch this namespace"
    )

    def render_plan(
        self, spec: MPIJobSpec, identity: RunIdentity, platform_env: Mapping[str, str] | None = None
    ) -> JobPlan:
        return render_trainjob_plan(spec, identity, platform_env=platform_env)

    def render(self, plan: JobPlan, namespace: str, *, redact_secrets: bool = False) -> list[Obj]:
        """The TrainJob, our Secret, our ConfigMap, the TrainingRuntime."""
        return list(render_trainjob_manifests(plan, namespace, redact_secrets=redact_secrets))

    def made_before_top(self, obj: Obj) -> bool:
        """The runtime (no key in it): Trainer, and Kueue's webhook, read it when the TrainJob is made."""
        return obj.get("kind") == "TrainingRuntime"

    def dependent_resource(self, obj: Obj) -> GVK:
        if obj.get("kind") == "TrainingRuntime":
            return TRAINING_RUNTIME
        return super().dependent_resource(obj)

    def refused_for_now(self, message: str) -> bool:
        """Kueue's TrainJob webhook (``vtrainjob.kb.io``) reads the runtime from its cache: a
        TrainJob created right after its runtime may be refused with "runtime '<job>' not found"
        until that cache has it (seen in the real tier)."""
        return "admission webhook" in message and "runtime" in message and "not found" in message

    def owns(self, obj: Obj) -> bool:
        """Owned by the TrainJob, or a pod of its JobSet (owned by a batch Job)."""
        labels = obj.get("metadata", {}).get("labels") or {}
        return super().owns(obj) or LABEL_JOBSET in labels

    def master_selector(self, job_name: str) -> str:
        return master_selector(job_name)

    def deletion_propagation(self) -> str:
        """``Background``: a foreground deletion ends with the garbage collector removing the
        TrainJob's finalizer, an update that Kueue's TrainJob webhook (``vtrainjob.kb.io``)
        denies once the runtime, deleted with the other dependents first, is gone ("runtime not
        found"): the TrainJob would stay for good. Deleted at once instead, the collector takes
        the JobSet, its Jobs and pods, and our objects after it; teardown waits for the pods."""
        return "Background"

    def custom_objects_to_delete(self, plan: JobPlan) -> list[tuple[str, str, str]]:
        """The TrainJob (the rest goes with it) and its runtime (should it not be owned yet)."""
        return [TRAINJOB[:3], TRAINING_RUNTIME[:3]]

    def leftovers(self, job_name: str) -> list[Leftover]:
        """Its pods, JobSet's headless Service and Trainer's snapshot of the runtime."""
        names = [("services", job_name), ("configmaps", f"{job_name}-runtime-snapshot")]
        return [*super().leftovers(job_name), *(Leftover(plural, name=name) for plural, name in names)]

    def _master_name(self, job_name: str) -> str:
        return master_host_name(job_name)

    def _pods_selector(self, job_name: str) -> str:
        return f"{LABEL_JOBSET}={job_name}"

    def _silent(self, top: Obj | None) -> bool:
        """Not yet run as a JobSet, and no condition."""
        status = (top or {}).get("status") or {}
        return top is not None and not status.get("jobsStatus") and not status.get("conditions")

    def _top_wait(self, top: Obj | None) -> str | None:
        """Suspended (Kueue has not admitted it), or not yet run as a JobSet with pods."""
        return describe_trainjob_wait(top)
