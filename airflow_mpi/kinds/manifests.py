"""Kubernetes objects of one job, as plain dicts (what ``airflow-mpi render`` prints and what the
Kubernetes backend creates): headless Service (the owner of the rest), Secret, ConfigMap,
worker pods, master pod. Core objects only: nothing to install in the cluster.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from airflow_mpi import contract
from airflow_mpi.contract import DEADLINE_GRACE_SECONDS, POD_TERMINATION_GRACE_SECONDS
from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.job.naming import LABEL_INDEX, LABEL_JOB, LABEL_PREFIX
from airflow_mpi.job.plan import JobPlan, PodPlan
from airflow_mpi.job.ssh import SshMaterial
from airflow_mpi.kinds.tolerations import render_tolerations
from airflow_mpi.spec import Role, RoleSpec, Volume, render_cpu

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"  # the Service's uid, known after create
REDACTED = "<generated per job; not shown>"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU feature discovery's node label
VOLUME_CONFIG = "mpi-config"
VOLUME_SSH = "mpi-ssh"
VOLUME_RUNTIME = "mpi-runtime"
VOLUME_SHM = "dshm"

Manifest = dict[str, Any]
GVK = tuple[str, str, str, str]  # an API resource: (group, version, plural, kind); group "": the core API
SERVICE: GVK = ("", "v1", "services", "Service")  # the ``pods`` kind's top object


def secret_name(job_name: str) -> str:
    return f"{job_name}-ssh"


def config_map_name(job_name: str) -> str:
    return f"{job_name}-config"


# A deferred job's shown mark (``observe.shown``): a Lease of its own, not the ConfigMap the pods
# mount (each write there was a whole ConfigMap, sent to every kubelet running the job's pods).
LOG_LEASE = ("coordination.k8s.io", "v1", "leases", "Lease")


def log_lease_name(job_name: str) -> str:
    return f"{job_name}-log"


def render_manifests(
    plan: JobPlan, namespace: str, *, owner_uid: str | None = None, redact_secrets: bool = False
) -> list[Manifest]:
    """Every object of the job in creation order: Service, Secret, ConfigMap, workers, master."""
    require_image(plan)
    owner = render_owner_reference(plan, owner_uid or PLACEHOLDER_UID)
    return [
        render_service(plan, namespace),
        render_secret(plan, namespace, owner, redact=redact_secrets),
        render_config_map(plan, namespace, owner),
        *(render_pod(plan, pod, namespace, owner) for pod in plan.workers),
        render_pod(plan, plan.master, namespace, owner),
    ]


def require_image(plan: JobPlan) -> None:
    if not plan.spec.image:
        raise SpecError(
            [SpecIssue("image", "is required on Kubernetes", "set the training image, e.g. one built from docker/")]
        )


def render_owner_reference(plan: JobPlan, uid: str) -> Manifest:
    """The headless Service owns every other object: deleting it garbage-collects the job."""
    return owner_reference_to(SERVICE, plan.job_name, uid)


def owner_reference_to(top: GVK, job_name: str, uid: str) -> Manifest:
    """The reference that makes an object a dependent of the job's top object ``top`` (named
    after the job, ``uid`` once created): deleting the top object garbage-collects it. Not
    ``blockOwnerDeletion``: a foreground deletion of the top object need not wait for it."""
    group, version, _, kind = top
    api_version = f"{group}/{version}" if group else version
    return {"apiVersion": api_version, "kind": kind, "name": job_name, "uid": uid, "controller": True}


_IDENTITY = (f"{LABEL_PREFIX}/dag-id", f"{LABEL_PREFIX}/task-id", f"{LABEL_PREFIX}/run-id")


def _metadata(plan: JobPlan, name: str, namespace: str, owner: Manifest | None, labels: Any = None) -> Manifest:
    identity = plan.identity
    meta: Manifest = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels if labels is not None else plan.labels),
        "annotations": {
            **plan.spec.pod.annotations,
            # Labels hold sanitized values; annotations keep the exact run identity.
            f"{LABEL_PREFIX}/dag-id": identity.dag_id,
            f"{LABEL_PREFIX}/task-id": identity.task_id,
            f"{LABEL_PREFIX}/run-id": identity.run_id,
        },
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def render_service(plan: JobPlan, namespace: str) -> Manifest:
    """Headless Service ``<job>``: ``<pod>.<job>`` resolves, even before pods are Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(plan, plan.job_name, namespace, None),
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_JOB: plan.job_name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": contract.SSH_PORT_NAME, "port": plan.spec.ssh_port, "targetPort": plan.spec.ssh_port}],
        },
    }


def render_secret(plan: JobPlan, namespace: str, owner: Manifest, *, redact: bool = False) -> Manifest:
    data = plan.secret_data()
    secret: Manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(plan, secret_name(plan.job_name), namespace, owner),
        "type": "Opaque",
    }
    if redact:  # for display: the keys are generated anew for every job anyway
        secret["stringData"] = dict.fromkeys(data, REDACTED)
    else:
        secret["data"] = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    return secret


def render_config_map(plan: JobPlan, namespace: str, owner: Manifest) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(plan, config_map_name(plan.job_name), namespace, owner),
        "data": dict(plan.config_files),
    }


def render_log_lease(plan: JobPlan, namespace: str, owner: Manifest) -> Manifest:
    """The Lease that keeps how many of the master's lines a deferred job's task log holds: no
    holder and no count yet (the first trigger writes both); the job's labels and identity, not
    the pods' annotations (a ``airflow-mpi.io/`` one there would preset the mark)."""
    metadata = _metadata(plan, log_lease_name(plan.job_name), namespace, owner)
    metadata["annotations"] = {key: value for key, value in metadata["annotations"].items() if key in _IDENTITY}
    group, version, _, kind = LOG_LEASE
    return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": metadata, "spec": {}}


def render_resources(role: RoleSpec) -> Manifest:
    amounts = {"cpu": render_cpu(role.cpu_cores)}
    if role.memory:
        amounts["memory"] = role.memory
    if role.gpus:
        amounts[role.gpu_resource] = str(role.gpus)
    # requests == limits: MPI ranks are gang-scheduled, a throttled or evicted rank stalls everyone.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _user_volume(volume: Volume) -> Manifest:
    source: Manifest
    if volume.host_path:
        source = {"hostPath": {"path": volume.host_path}}
    elif volume.persistent_volume_claim:
        source = {"persistentVolumeClaim": {"claimName": volume.persistent_volume_claim, "readOnly": volume.read_only}}
    elif volume.config_map:
        source = {"configMap": {"name": volume.config_map}}
    elif volume.secret:
        source = {"secret": {"secretName": volume.secret}}
    else:
        source = {"emptyDir": {}}
    return {"name": volume.name, **source}


def render_pod(plan: JobPlan, pod: PodPlan, namespace: str, owner: Manifest | None) -> Manifest:
    spec = plan.spec
    role = spec.master if pod.role.value == "master" else spec.workers
    paths = plan.paths
    shared_files = sorted(contract.SSH_SHARED_FILES)
    ssh_items = [{"key": name, "path": name} for name in shared_files]
    ssh_items.append({"key": contract.host_key_file(pod.name), "path": contract.SSH_HOST_KEY})

    mounts = [
        {"name": VOLUME_CONFIG, "mountPath": paths.config_dir, "readOnly": True},
        {"name": VOLUME_SSH, "mountPath": paths.ssh_secret_dir, "readOnly": True},
    ]
    volumes: list[Manifest] = [
        {"name": VOLUME_CONFIG, "configMap": {"name": config_map_name(plan.job_name), "defaultMode": 0o755}},
        {
            "name": VOLUME_SSH,
            # Only this pod's own host key, never the other pods' (items).
            "secret": {"secretName": secret_name(plan.job_name), "defaultMode": 0o400, "items": ssh_items},
        },
    ]
    if spec.pod.run_as is None:
        mounts.append({"name": VOLUME_RUNTIME, "mountPath": paths.runtime_dir})
        volumes.append({"name": VOLUME_RUNTIME, "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}})
    # Without root the runtime directory is the image's, owned by the job's user: an emptyDir is
    # writable by everyone, and sshd (StrictModes) refuses authorized_keys under such a directory.
    if spec.pod.shm_size:
        mounts.append({"name": VOLUME_SHM, "mountPath": "/dev/shm"})
        volumes.append({"name": VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": spec.pod.shm_size}})
    for volume in spec.pod.volumes:
        mount: Manifest = {"name": volume.name, "mountPath": volume.mount_path, "readOnly": volume.read_only}
        if volume.sub_path:
            mount["subPath"] = volume.sub_path
        mounts.append(mount)
        volumes.append(_user_volume(volume))

    container: Manifest = {
        "name": contract.CONTAINER_NAME,
        "image": spec.image,
        "command": ["bash", paths.launch_script],
        "env": [{"name": name, "value": value} for name, value in pod.env.items()],
        "ports": [{"name": contract.SSH_PORT_NAME, "containerPort": spec.ssh_port, "protocol": "TCP"}],
        "resources": render_resources(role),
        "volumeMounts": mounts,
    }
    if spec.pod.image_pull_policy:
        container["imagePullPolicy"] = spec.pod.image_pull_policy
    container["securityContext"] = render_container_security_context(spec.pod.run_as)
    if pod.role.value == "worker":
        # Ready once sshd listens; the master's launch script then checks a real ssh login.
        container["readinessProbe"] = {
            "tcpSocket": {"port": spec.ssh_port},
            "periodSeconds": 2,
            "failureThreshold": 1,
            "successThreshold": 1,
            "timeoutSeconds": 1,
        }

    node_selector = dict(spec.pod.node_selector)
    if role.gpus and role.gpu_type:
        node_selector.setdefault(GPU_PRODUCT_LABEL, role.gpu_type)
    pod_spec: Manifest = {
        "hostname": pod.name,
        "subdomain": plan.job_name,
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": POD_TERMINATION_GRACE_SECONDS,
        "activeDeadlineSeconds": spec.startup_timeout + spec.timeout + DEADLINE_GRACE_SECONDS,
        "containers": [container],
        "volumes": volumes,
    }
    pod_spec["securityContext"] = render_pod_security_context(spec.pod.run_as)
    if spec.pod.service_account:
        pod_spec["serviceAccountName"] = spec.pod.service_account
    else:
        pod_spec["automountServiceAccountToken"] = False  # training needs no API access
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    pod_spec["tolerations"] = render_tolerations(spec.pod.tolerations)
    if spec.pod.priority_class:
        pod_spec["priorityClassName"] = spec.pod.priority_class
    if spec.pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.pod.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(plan, pod.name, namespace, owner, pod.labels),
        "spec": pod_spec,
    }


def render_pod_security_context(run_as: tuple[int, int] | None) -> Manifest:
    """Every pod's: the container runtime's default seccomp profile (the syscalls a container
    never needs, e.g. kexec, mount of new filesystems, kernel modules, refused). A job without root
    (``run_as``: uid, gid) gets the pod-level fields of the Pod Security Standards' "restricted"
    profile too (docs/contract.md#jobs-without-root)."""
    seccomp = {"seccompProfile": {"type": "RuntimeDefault"}}
    if run_as is None:
        return seccomp
    uid, gid = run_as
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        # The kubelet makes the ssh Secret's files group-readable by this group (0440): the
        # launch script, running as the job's user, can then copy them to its own 0600 files.
        "fsGroup": gid,
        **seccomp,
    }


def render_container_security_context(run_as: tuple[int, int] | None) -> Manifest:
    """Every container's: no privilege escalation (``no_new_privs``: a setuid binary in the image
    cannot raise a process's privileges). A root job keeps root's capabilities, which sshd's
    privilege separation needs (setuid/setgid to its own user, chroot to /run/sshd: no_new_privs
    leaves those alone). A job without root (``run_as``) gets the restricted profile's container
    fields, and the user, group and seccomp profile again, for policy engines that look at
    containers only."""
    if run_as is None:
        return {"allowPrivilegeEscalation": False}
    uid, gid = run_as
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def render_pod_template(
    plan: JobPlan,
    first: PodPlan,
    namespace: str,
    *,
    secret: str,
    config_map: str,
    controller_sets: tuple[str, ...] = ("hostname", "subdomain"),
) -> Manifest:
    """A role's pod template for a controller that makes the role's pods (a Volcano task, an
    MPIJob replica, a JobSet's Job), from the role's first pod: no per-worker index label, none of
    the fields the controller sets itself (``controller_sets``), our Secret and ConfigMap under
    the kind's names (``secret``, ``config_map``). The container's env is the caller's to adjust."""
    pod = render_pod(plan, first, namespace, None)
    metadata = pod["metadata"]
    labels = dict(metadata["labels"])
    if first.role.value == "worker":
        labels.pop(LABEL_INDEX, None)
    pod_spec = pod["spec"]
    for name in controller_sets:
        pod_spec.pop(name, None)
    for volume in pod_spec["volumes"]:
        if volume["name"] == VOLUME_CONFIG:
            volume["configMap"]["name"] = config_map
        elif volume["name"] == VOLUME_SSH:
            volume["secret"]["secretName"] = secret
    return {"metadata": {"labels": labels, "annotations": dict(metadata["annotations"])}, "spec": pod_spec}


def downward_pod_name(item: dict[str, Any]) -> dict[str, Any]:
    """An env item of the pod's own name, given by the API instead (a controller's template
    serves every pod of a role, so the name cannot be written into it)."""
    if item["name"] != contract.ENV_POD_NAME:
        return item
    return {"name": item["name"], "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}


def share_worker_host_key(plan: JobPlan) -> JobPlan:
    """The plan with one host key for every worker: a controller makes every worker from one
    template (a Volcano task, an MPIJob's or a JobSet's replicated Job), so they share it."""
    if not plan.workers:
        return plan
    shared = plan.ssh.host_keys[plan.workers[0].name]
    keys = {pod.name: shared if pod.role is Role.WORKER else plan.ssh.host_keys[pod.name] for pod in plan.pods}
    return dataclasses.replace(plan, ssh=SshMaterial(client=plan.ssh.client, host_keys=keys))
