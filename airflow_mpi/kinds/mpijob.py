"""The MPIJob backend's objects: one ``kubeflow.org/v2beta1`` MPIJob plus our Secret and
ConfigMap, owned by it.

mpi-operator creates the pods from two templates: the launcher (our master, a batch/v1 Job whose
pod name gets a random suffix, host ``<job>-launcher.<job>``) and the workers (pods
``<job>-worker-<i>``, hosts ``<job>-worker-<i>.<job>``, the names the pod contract already uses).
So the plan names its master ``<job>-launcher``: ``GJ_TRAINING_POD_NAME`` on the launcher is that
literal name (the one that resolves), and on workers the pod's own name from the downward API.

The controller owns ``<job>`` (Service), ``<job>-ssh`` (Secret) and ``<job>-config`` (ConfigMap,
mounted on the launcher at ``/etc/mpi``): ours get other names and our config directory moves to
``/etc/airflow-mpi/config``; in hostfile mode the launch script reads the controller's
``/etc/mpi/hostfile``. Airflow owns retries: launcher ``restartPolicy: Never`` with
``backoffLimit: 0`` (a failed launcher pod and its log are kept), ``cleanPodPolicy: Running``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import ClassVar

from airflow_mpi import contract
from airflow_mpi.contract import DEADLINE_GRACE_SECONDS, PodPaths
from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.job.naming import RunIdentity, build_host_name, build_job_name
from airflow_mpi.job.plan import JobPlan, PodPlan, render_plan
from airflow_mpi.job.ssh import SshMaterial
from airflow_mpi.kinds.base import Leftover, Obj, top_condition
from airflow_mpi.kinds.controller import ControllerKind
from airflow_mpi.kinds.gang import KUEUE_QUEUE_LABEL, group_size, sum_requests
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
from airflow_mpi.spec import Gang, HostsMode, MPIJobSpec, Role
from airflow_mpi.spec.formats import DNS_LABEL

MPIJOB: GVK = ("kubeflow.org", "v2beta1", "mpijobs", "MPIJob")
LAUNCHER = "Launcher"
WORKER = "Worker"
# mpi-operator's name of each MPI: it writes the hostfile in that MPI's format (``host slots=N``
# or ``host:N``) and sets that launcher's variables.
OPERATOR_IMPLEMENTATION = {"openmpi": "OpenMPI", "mpich": "MPICH", "intel": "Intel"}
# The controller's hostfile, on the launcher only; our own files move out of its /etc/mpi.
CONTROLLER_HOSTFILE = "/etc/mpi/hostfile"
MPIJOB_PATHS = PodPaths(config_dir="/etc/airflow-mpi/config", controller_hostfile=CONTROLLER_HOSTFILE)
# Where the controller mounts its own ssh Secret (``sshAuthMountPath``). Our launch script takes
# its keys, pinned host keys and configs from our Secret; this key is mounted out of the way,
# never read, and never in an authorized_keys our sshd uses.
OPERATOR_SSH_MOUNT = "/etc/airflow-mpi/operator-ssh"
CLUSTER_DOMAIN = "cluster.local"  # the controller appends it to the workers' DNS search path
# The controller's labels on every pod it creates.
LABEL_OPERATOR_JOB = "training.kubeflow.org/job-name"
LABEL_OPERATOR_ROLE = "training.kubeflow.org/job-role"


def launcher_name(job_name: str) -> str:
    """The launcher's host name (its pod's name has a random suffix and does not resolve)."""
    return f"{job_name}-launcher"


def mpijob_secret_name(job_name: str) -> str:
    """Not ``<job>-ssh``: the controller's, which it refuses to share (ErrResourceExists)."""
    return f"{job_name}-airflow-ssh"


def mpijob_config_map_name(job_name: str) -> str:
    """Not ``<job>-config``: the controller's hostfile ConfigMap."""
    return f"{job_name}-airflow-config"


def launcher_selector(job_name: str) -> str:
    """The controller's selector for a job's launcher pods (the newest is the one that counts)."""
    return f"{LABEL_OPERATOR_JOB}={job_name},{LABEL_OPERATOR_ROLE}=launcher"


def render_mpijob_plan(
    spec: MPIJobSpec,
    identity: RunIdentity,
    *,
    ssh: SshMaterial | None = None,
    platform_env: Mapping[str, str] | None = None,
) -> JobPlan:
    """The plan of a job run as an MPIJob: master ``<job>-launcher``, paths off ``/etc/mpi``;
    SpecError for what mpi-operator would refuse or cannot express."""
    master = launcher_name(build_job_name(spec.name, identity))
    plan = render_plan(spec, identity, ssh=ssh, paths=MPIJOB_PATHS, master_pod=master, platform_env=platform_env)
    issues = check_mpijob_plan(plan)
    if issues:
        raise SpecError(issues)
    return plan


def render_mpijob_manifests(
    plan: JobPlan, namespace: str, *, owner_uid: str | None = None, redact_secrets: bool = False
) -> list[Manifest]:
    """Every object the MPIJob backend creates: the MPIJob, our Secret and our ConfigMap, owned
    by it (the backend creates them right after it, with the owner its uid makes)."""
    require_image(plan)
    issues = check_mpijob_plan(plan)
    if issues:
        raise SpecError(issues)
    plan = share_worker_host_key(plan)
    owner = owner_reference_to(MPIJOB, plan.job_name, owner_uid or PLACEHOLDER_UID)
    secret = render_secret(plan, namespace, owner, redact=redact_secrets)
    secret["metadata"]["name"] = mpijob_secret_name(plan.job_name)
    if "data" in secret:
        known_hosts = render_mpijob_known_hosts(plan, namespace)
        secret["data"][contract.SSH_KNOWN_HOSTS] = base64.b64encode(known_hosts.encode()).decode()
    config_map = render_config_map(plan, namespace, owner)
    config_map["metadata"]["name"] = mpijob_config_map_name(plan.job_name)
    return [render_mpijob(plan, namespace), secret, config_map]


def check_mpijob_plan(plan: JobPlan) -> list[SpecIssue]:
    """What mpi-operator would refuse (it only emits a ValidationError event, and the job waits
    forever) or cannot express, before anything is created."""
    if plan.master.name != launcher_name(plan.job_name) or plan.paths != MPIJOB_PATHS:
        raise ValueError("an MPIJob is rendered from render_mpijob_plan's plan (master <job>-launcher)")
    issues = []
    spec, slots = plan.spec, plan.topology.slot_plan
    if plan.workers and not DNS_LABEL.match(plan.workers[-1].name):
        issues.append(
            SpecIssue("name", f"makes the worker name {plan.workers[-1].name!r}", "use a name starting with a letter")
        )
    uneven = slots.master_slots and plan.workers and slots.master_slots != slots.worker_slots
    if spec.hosts_mode is HostsMode.HOSTFILE and uneven:
        issues.append(
            SpecIssue(
                "hosts_mode",
                f"is 'hostfile', but mpi-operator writes one slot count for every host "
                f"(workers {slots.worker_slots}) and the master runs {slots.master_slots} ranks",
                "use hosts_mode 'host', or give master and workers the same GPUs (or cores)",
            )
        )
    return issues


def render_mpijob(plan: JobPlan, namespace: str) -> Manifest:
    """The ``kubeflow.org/v2beta1`` MPIJob: launcher = our master, workers = ours."""
    spec, slots = plan.spec, plan.topology.slot_plan
    replicas: Manifest = {LAUNCHER: _replica(plan, plan.master, 1, namespace)}
    if plan.workers:
        replicas[WORKER] = _replica(plan, plan.workers[0], len(plan.workers), namespace)
    run_policy: Manifest = {
        "cleanPodPolicy": "Running",  # the workers go when the launcher ends; its pod stays
        "backoffLimit": 0,  # Airflow owns retries
        "activeDeadlineSeconds": spec.startup_timeout + spec.timeout + DEADLINE_GRACE_SECONDS,
    }
    scheduling_policy = render_scheduling_policy(plan)
    if scheduling_policy:
        run_policy["schedulingPolicy"] = scheduling_policy
    master = render_pod(plan, plan.master, namespace, None)
    labels = dict(plan.labels)
    if spec.scheduling.queue and spec.scheduling.gang in (None, Gang.KUEUE):
        labels[KUEUE_QUEUE_LABEL] = spec.scheduling.queue  # Kueue's MPIJob integration
    group, version, _, kind = MPIJOB
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": {
            "name": plan.job_name,
            "namespace": namespace,
            "labels": labels,
            "annotations": dict(master["metadata"]["annotations"]),
        },
        "spec": {
            # Every hostfile line gets it (the launcher's too, when it runs ranks).
            "slotsPerWorker": (slots.worker_slots if plan.workers else slots.master_slots) or 1,
            "runLauncherAsWorker": bool(slots.master_slots),
            "launcherCreationPolicy": "AtStartup",  # the launch script waits for the workers' sshd
            "mpiImplementation": OPERATOR_IMPLEMENTATION[spec.mpi.implementation],
            "sshAuthMountPath": OPERATOR_SSH_MOUNT,
            "runPolicy": run_policy,
            "mpiReplicaSpecs": replicas,
        },
    }


def render_scheduling_policy(plan: JobPlan) -> Manifest:
    """``runPolicy.schedulingPolicy`` for an operator started with ``--gang-scheduling``: the
    whole job (launcher and workers) as one group; {} without a gang setting (or for Kueue,
    which queues the MPIJob by its label)."""
    scheduling = plan.spec.scheduling
    if scheduling.gang not in (Gang.VOLCANO, Gang.COSCHEDULING):
        return {}
    policy: Manifest = {"minAvailable": group_size(plan), "minResources": sum_requests(plan)}
    if scheduling.queue:
        policy["queue"] = scheduling.queue
    if plan.spec.pod.priority_class:
        policy["priorityClass"] = plan.spec.pod.priority_class
    return policy


def _replica(plan: JobPlan, first: PodPlan, replicas: int, namespace: str) -> Manifest:
    return {"replicas": replicas, "restartPolicy": "Never", "template": _template(plan, first, namespace)}


def _template(plan: JobPlan, first: PodPlan, namespace: str) -> Manifest:
    """A role's pod template: the controller sets host names and ``restartPolicy`` (from the
    replica spec, with a warning event if the template has one); the config directory named to
    the launch script."""
    template = render_pod_template(
        plan,
        first,
        namespace,
        secret=mpijob_secret_name(plan.job_name),
        config_map=mpijob_config_map_name(plan.job_name),
        controller_sets=("hostname", "subdomain", "restartPolicy"),
    )
    container = template["spec"]["containers"][0]
    env = [downward_pod_name(item) if first.role is Role.WORKER else item for item in container["env"]]
    env.append({"name": contract.ENV_CONFIG_DIR, "value": plan.paths.config_dir})
    if first.role is Role.MASTER and plan.spec.hosts_mode is HostsMode.HOSTFILE:
        env.append({"name": contract.ENV_HOSTFILE, "value": plan.paths.hostfile})
    container["env"] = env
    return template


def render_mpijob_known_hosts(plan: JobPlan, namespace: str) -> str:
    """known_hosts pinning every pod's host key under ``<pod>.<job>``, ``<pod>`` and the names
    mpi-operator's hostfile uses (``<pod>.<job>.<ns>.svc``, with and without the cluster domain)."""
    lines = []
    for pod, key in plan.ssh.host_keys.items():
        host = build_host_name(plan.job_name, pod)
        names = [host, pod, f"{host}.{namespace}.svc", f"{host}.{namespace}.svc.{CLUSTER_DOMAIN}"]
        lines.append(f"{','.join(names)} {' '.join(key.public_openssh.split()[:2])}\n")
    return "".join(lines)


# --- the MPIJob's status -------------------------------------------------------------------------


def describe_mpijob_wait(mpijob: Manifest | None, pods_exist: bool) -> str | None:
    """Why an MPIJob has no pods yet (suspended until Kueue admits it, or the gang waits), or
    None once it runs, ends, or is not there."""
    if mpijob is None or top_condition(mpijob, "Succeeded") or top_condition(mpijob, "Failed"):
        return None
    queue = (mpijob.get("metadata", {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    if top_condition(mpijob, "Suspended") is not None:
        where = f" in queue {queue!r}" if queue else ""
        return f"queued: MPIJob suspended{where} until it is admitted"
    if pods_exist:
        return None
    if top_condition(mpijob, "Created") is None:
        return "queued: MPIJob not yet seen by mpi-operator"
    return "queued: MPIJob created, mpi-operator has not created its pods yet"


class MPIJobKind(ControllerKind):
    """A ``kubeflow.org`` MPIJob: mpi-operator creates the workers and a launcher batch Job whose
    newest pod is the master, and removes the workers once the launcher ended."""

    name = "mpijob"
    top_label = "MPIJob"
    top_resource = MPIJOB
    launcher_owner: ClassVar[tuple[str, str]] = ("batch/v1", "Job")  # the launcher pod's owner
    _master_generated = True
    _rules = ({"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": ["create", "get", "list", "delete"]},)
    _trigger_rules = ({"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": ["get", "delete"]},)
    _refusal_event = "ValidationError"  # an invalid MPIJob gets this event and no condition
    _refused_by = "mpi-operator refused"
    _silence = (
        "MPIJob {job}: mpi-operator has not acted on it in {waited:.0f}s (no condition, no pods): "
        "install mpi-operator v0.5.0 or later, or check that it is running and watches this namespace"
    )

    def render_plan(
        self, spec: MPIJobSpec, identity: RunIdentity, platform_env: Mapping[str, str] | None = None
    ) -> JobPlan:
        return render_mpijob_plan(spec, identity, platform_env=platform_env)

    def render(self, plan: JobPlan, namespace: str, *, redact_secrets: bool = False) -> list[Obj]:
        """The MPIJob, our Secret, our ConfigMap."""
        return list(render_mpijob_manifests(plan, namespace, redact_secrets=redact_secrets))

    def owns(self, obj: Obj) -> bool:
        """Owned by the MPIJob, or by its launcher's batch Job (the launcher pod, which carries
        the operator's label); or by nothing: a Secret that earlier versions made before the MPIJob."""
        meta = obj.get("metadata", {})
        refs = meta.get("ownerReferences") or []
        launcher = LABEL_OPERATOR_JOB in (meta.get("labels") or {})
        owners = (self._top_owner, self.launcher_owner) if launcher else (self._top_owner,)
        return not refs or any((ref.get("apiVersion"), ref.get("kind")) in owners for ref in refs)

    def master_selector(self, job_name: str) -> str:
        return launcher_selector(job_name)

    def leftovers(self, job_name: str) -> list[Leftover]:
        """Its pods, and the controller's own Service, ssh Secret and hostfile ConfigMap."""
        names = [("services", job_name), ("secrets", f"{job_name}-ssh"), ("configmaps", f"{job_name}-config")]
        return [*super().leftovers(job_name), *(Leftover(plural, name=name) for plural, name in names)]

    def _master_name(self, job_name: str) -> str:
        return launcher_name(job_name)

    def _pods_selector(self, job_name: str) -> str:
        return f"{LABEL_OPERATOR_JOB}={job_name}"

    def _top_wait(self, top: Obj | None) -> str | None:
        """Suspended (Kueue has not admitted it) or without pods yet (its gang waits)."""
        return describe_mpijob_wait(top, False)
