"""What mpi-operator v2beta1's controller makes of an MPIJob, as pure functions of the job.

Read from its source (``pkg/apis/kubeflow/v2beta1/default.go``, ``validation/validation.go``,
``pkg/controller/mpi_job_controller.go`` and ``_status.go``, v0.8.x): the defaults it applies in
memory, the validation whose failure is only a ``ValidationError`` event, and the objects it
creates (Service ``<job>``, Secret ``<job>-ssh``, ConfigMap ``<job>-config``, worker pods
``<job>-worker-<i>``, the batch/v1 Job ``<job>-launcher``), with their names, labels, mounts and
injected env. ``mpijob_controller`` does the I/O against the API double.
"""

from __future__ import annotations

import base64
import copy
import time
from typing import Any

from tests.doubles.apiformats import is_dns1035_label

Obj = dict[str, Any]

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"
OPERATOR = "mpi-operator"
OPERATOR_LABEL = "training.kubeflow.org/operator-name"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
CONFIG_MOUNT = "/etc/mpi"
ROOT_SSH = "/root/.ssh"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
CLEAN_POLICIES = ("All", "None", "Running")
IMPLEMENTATIONS = ("Intel", "MPICH", "OpenMPI")
RESTART_POLICIES = ("Never", "OnFailure")
MANAGED_BY = ("kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue")
EVENT_MESSAGE_LIMIT = 1024
SSH_ITEMS = [
    {"key": "ssh-privatekey", "path": "id_rsa"},
    {"key": "ssh-publickey", "path": "id_rsa.pub"},
    {"key": "ssh-publickey", "path": "authorized_keys"},
]
CONFIG_ITEMS = [
    {"key": "hostfile", "path": "hostfile", "mode": 0o444},
    {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o555},
]
OMPI_ENV = [
    {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
    {"name": "OMPI_MCA_orte_default_hostfile", "value": f"{CONFIG_MOUNT}/hostfile"},
    {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
]
INTEL_ENV = [
    {"name": "I_MPI_HYDRA_HOST_FILE", "value": f"{CONFIG_MOUNT}/hostfile"},
    {"name": "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
]
MPICH_ENV = [
    {"name": "HYDRA_HOST_FILE", "value": f"{CONFIG_MOUNT}/hostfile"},
    {"name": "HYDRA_LAUNCH_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
]
NVIDIA_BLANK = [{"name": "NVIDIA_VISIBLE_DEVICES"}, {"name": "NVIDIA_DRIVER_CAPABILITIES"}]


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --- defaults and validation -------------------------------------------------------------------


def defaulted(job: Obj) -> Obj:
    """The job as the controller sees it after ``scheme.Default`` (default.go): a copy."""
    job = copy.deepcopy(job)
    spec = job.setdefault("spec", {})
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    spec.setdefault("slotsPerWorker", 1)
    spec["sshAuthMountPath"] = spec.get("sshAuthMountPath") or ROOT_SSH
    spec["mpiImplementation"] = spec.get("mpiImplementation") or "OpenMPI"
    spec["launcherCreationPolicy"] = spec.get("launcherCreationPolicy") or "AtStartup"
    replicas = spec.get("mpiReplicaSpecs") or {}
    for role, policy, count in (("Launcher", "OnFailure", 1), ("Worker", "Never", 0)):
        if isinstance(replicas.get(role), dict):
            replicas[role]["restartPolicy"] = replicas[role].get("restartPolicy") or policy
            replicas[role].setdefault("replicas", count)
    return job


def validation_errors(job: Obj) -> list[str]:
    """``ValidateMPIJob`` on a defaulted job: each error as Go's ``field.Error`` prints it."""
    spec = job.get("spec") or {}
    errors = _name_errors(job)
    replicas = spec.get("mpiReplicaSpecs")
    path = "spec.mpiReplicaSpecs"
    if not replicas:
        errors.append(f"{path}: Required value: must have replica specs")
    else:
        launcher, worker = replicas.get("Launcher"), replicas.get("Worker")
        if launcher is None:
            errors.append(f"{path}[Launcher]: Required value: must have Launcher replica spec")
        else:
            errors += _replica_errors(launcher, f"{path}[Launcher]")
            if launcher.get("replicas") is not None and launcher["replicas"] != 1:
                errors.append(f"{path}[Launcher].replicas: Invalid value: {launcher['replicas']}: must be 1")
        if worker is not None:
            errors += _replica_errors(worker, f"{path}[Worker]")
            if worker.get("replicas") is not None and worker["replicas"] <= 0:
                errors.append(
                    f"{path}[Worker].replicas: Invalid value: {worker['replicas']}: must be greater than or equal to 1"
                )
    slots = spec.get("slotsPerWorker")
    if slots is None:
        errors.append("spec.slotsPerWorker: Required value: must have number of slots per worker")
    elif slots < 0:
        errors.append(f"spec.slotsPerWorker: Invalid value: {slots}: must be greater than or equal to 0")
    errors += _run_policy_errors(spec.get("runPolicy") or {})
    if not spec.get("sshAuthMountPath"):
        errors.append("spec.sshAuthMountPath: Required value: must have a mount path for SSH credentials")
    if spec.get("mpiImplementation") not in IMPLEMENTATIONS:
        errors.append(_unsupported("spec.mpiImplementation", spec.get("mpiImplementation"), IMPLEMENTATIONS))
    return errors


def _name_errors(job: Obj) -> list[str]:
    worker = ((job.get("spec") or {}).get("mpiReplicaSpecs") or {}).get("Worker") or {}
    count = worker.get("replicas") or 1
    longest = f"{job['metadata']['name']}-worker-{max(count, 1) - 1}"
    problems = is_dns1035_label(longest)
    if not problems:
        return []
    return [
        f'metadata.name: Invalid value: "{job["metadata"]["name"]}": will not able to create pod and service '
        f'with invalid DNS label "{longest}": ' + ", ".join(problems)
    ]


def _replica_errors(replica: Obj, path: str) -> list[str]:
    errors = []
    if replica.get("replicas") is None:
        errors.append(f"{path}.replicas: Required value: must define number of replicas")
    if replica.get("restartPolicy") not in RESTART_POLICIES:
        errors.append(_unsupported(f"{path}.restartPolicy", replica.get("restartPolicy"), RESTART_POLICIES))
    if not ((replica.get("template") or {}).get("spec") or {}).get("containers"):
        errors.append(f"{path}.template.spec.containers: Required value: must define at least one container")
    return errors


def _run_policy_errors(policy: Obj) -> list[str]:
    errors = []
    if policy.get("cleanPodPolicy") not in CLEAN_POLICIES:
        errors.append(_unsupported("spec.runPolicy.cleanPodPolicy", policy.get("cleanPodPolicy"), CLEAN_POLICIES))
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if policy.get(key) is not None and policy[key] < 0:
            errors.append(f"spec.runPolicy.{key}: Invalid value: {policy[key]}: must be greater than or equal to 0")
    if policy.get("managedBy") is not None and policy["managedBy"] not in MANAGED_BY:
        errors.append(_unsupported("spec.runPolicy.managedBy", policy["managedBy"], MANAGED_BY))
    return errors


def _unsupported(path: str, value: Any, supported: tuple[str, ...]) -> str:
    listed = ", ".join(f'"{s}"' for s in supported)
    return f'{path}: Unsupported value: "{value or ""}": supported values: {listed}'


def validation_message(errors: list[str]) -> str:
    """The ``ValidationError`` event's message: Go's aggregate of the errors, truncated."""
    joined = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return truncate(f"Found validation errors: {joined}")


def truncate(message: str) -> str:
    return message if len(message) <= EVENT_MESSAGE_LIMIT else message[: EVENT_MESSAGE_LIMIT - 3] + "..."


# --- small readers -------------------------------------------------------------------------------


def worker_replicas(job: Obj) -> int:
    worker = job["spec"]["mpiReplicaSpecs"].get("Worker")
    return int(worker.get("replicas") or 0) if worker else 0


def launcher_as_worker(job: Obj) -> bool:
    return bool(job["spec"].get("runLauncherAsWorker"))


def suspended(job: Obj) -> bool:
    return bool((job["spec"].get("runPolicy") or {}).get("suspend"))


def worker_name(job: Obj, index: int) -> str:
    return f"{job['metadata']['name']}-worker-{index}"


def controller_ref(job: Obj) -> Obj:
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controlled_by(obj: Obj, owner_uid: str) -> bool:
    return any(r.get("controller") and r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences") or [])


def default_labels(name: str, role: str) -> dict[str, str]:
    return {OPERATOR_LABEL: OPERATOR, JOB_NAME_LABEL: name, JOB_ROLE_LABEL: role}


# --- the objects --------------------------------------------------------------------------------


def service(job: Obj) -> Obj:
    """Headless Service ``<job>`` selecting the launcher and the workers."""
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"app": name}, "ownerReferences": [controller_ref(job)]},
        "spec": {
            "clusterIP": "None",
            "selector": {OPERATOR_LABEL: OPERATOR, JOB_NAME_LABEL: name},
            "publishNotReadyAddresses": launcher_as_worker(job),
        },
    }


def ssh_secret(job: Obj, private_pem: str, public_key: str) -> Obj:
    """Secret ``<job>-ssh`` of type ssh-auth (the key pair is made by the caller)."""
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-ssh", "labels": {"app": name}, "ownerReferences": [controller_ref(job)]},
        "type": "kubernetes.io/ssh-auth",
        "data": {
            "ssh-privatekey": base64.b64encode(private_pem.encode()).decode(),
            "ssh-publickey": base64.b64encode(public_key.encode()).decode(),
        },
    }


def host(job: Obj, pod: str, cluster_domain: str = "") -> str:
    meta = job["metadata"]
    return f"{pod}.{meta['name']}.{meta['namespace']}.svc" + (f".{cluster_domain}" if cluster_domain else "")


def hostfile(job: Obj, cluster_domain: str = "") -> str:
    """One line per host, the launcher first with runLauncherAsWorker; OpenMPI ``host slots=N``,
    Intel and MPICH ``host:N``."""
    slots = job["spec"].get("slotsPerWorker", 1)
    pods = [f"{job['metadata']['name']}-launcher"] if launcher_as_worker(job) else []
    pods += [worker_name(job, i) for i in range(worker_replicas(job))]
    form = "{} slots={}" if job["spec"]["mpiImplementation"] == "OpenMPI" else "{}:{}"
    return "".join(form.format(host(job, pod, cluster_domain), slots) + "\n" for pod in pods)


def discover_hosts(job: Obj, running_workers: list[str], cluster_domain: str = "") -> str:
    """``discover_hosts.sh``: echoes the Running workers (sorted), the launcher first if it works."""
    pods = [f"{job['metadata']['name']}-launcher"] if launcher_as_worker(job) else []
    pods += sorted(running_workers)
    return "#!/bin/sh\n" + "".join(f"echo {host(job, pod, cluster_domain)}\n" for pod in pods)


def config_map(job: Obj, running_workers: list[str], cluster_domain: str = "") -> Obj:
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config", "labels": {"app": name}, "ownerReferences": [controller_ref(job)]},
        "data": {
            "hostfile": hostfile(job, cluster_domain),
            "discover_hosts.sh": discover_hosts(job, running_workers, cluster_domain),
        },
    }


def _setup_ssh(spec: Obj, job: Obj) -> None:
    """The Secret's keys as id_rsa, id_rsa.pub and authorized_keys at sshAuthMountPath in
    container[0]; mode 0600 only when the path is /root/.ssh."""
    path = job["spec"]["sshAuthMountPath"]
    source: Obj = {"secretName": f"{job['metadata']['name']}-ssh", "items": copy.deepcopy(SSH_ITEMS)}
    if path == ROOT_SSH:
        source["defaultMode"] = 0o600
    spec.setdefault("volumes", []).append({"name": "ssh-auth", "secret": source})
    spec["containers"][0].setdefault("volumeMounts", []).append({"name": "ssh-auth", "mountPath": path})


def _decorate_for_gang(template: Obj, job: Obj, gang_scheduler: str) -> None:
    """With ``--gang-scheduling``: the scheduler's name and the PodGroup ``<job>`` on the pod."""
    template["spec"]["schedulerName"] = gang_scheduler
    if gang_scheduler == "volcano":
        template.setdefault("metadata", {}).setdefault("annotations", {})[VOLCANO_GROUP_ANNOTATION] = job["metadata"][
            "name"
        ]
    else:
        template.setdefault("metadata", {}).setdefault("labels", {})["scheduling.x-k8s.io/pod-group"] = job["metadata"][
            "name"
        ]


def worker_pod(job: Obj, index: int, gang_scheduler: str = "") -> Obj:
    """Worker pod ``<job>-worker-<i>``: hostname = pod name, subdomain = job."""
    name = job["metadata"]["name"]
    replica = job["spec"]["mpiReplicaSpecs"]["Worker"]
    template = copy.deepcopy(replica.get("template") or {})
    meta = template.setdefault("metadata", {})
    labels = {**(meta.get("labels") or {}), **default_labels(name, "worker")}
    labels[REPLICA_INDEX_LABEL] = str(index + 1 if launcher_as_worker(job) else index)
    meta["labels"] = labels
    spec = template["spec"]
    pod_name = worker_name(job, index)
    spec.update(hostname=pod_name, subdomain=name)
    if spec.get("hostNetwork"):
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    searches = f"{name}.{job['metadata']['namespace']}.svc.cluster.local"
    spec.setdefault("dnsConfig", {}).setdefault("searches", []).append(searches)
    spec["restartPolicy"] = replica["restartPolicy"]
    container = spec["containers"][0]
    if not container.get("command") and not container.get("args"):
        container["command"] = ["/usr/sbin/sshd", "-De"]
    container["env"] = [*(container.get("env") or []), {"name": "K_MPI_JOB_ROLE", "value": "worker"}]
    _setup_ssh(spec, job)
    if gang_scheduler:
        _decorate_for_gang(template, job, gang_scheduler)
    pod_meta: Obj = {"name": pod_name, "labels": template["metadata"]["labels"]}
    if template["metadata"].get("annotations"):
        pod_meta["annotations"] = template["metadata"]["annotations"]
    pod_meta["ownerReferences"] = [controller_ref(job)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def launcher_template(job: Obj, gang_scheduler: str = "") -> tuple[Obj, list[str]]:
    """The launcher Job's pod template, and the Warning events building it raises."""
    name = job["metadata"]["name"]
    replica = job["spec"]["mpiReplicaSpecs"]["Launcher"]
    template = copy.deepcopy(replica.get("template") or {})
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **default_labels(name, "launcher")}
    if gang_scheduler:
        _decorate_for_gang(template, job, gang_scheduler)
    if launcher_as_worker(job):
        meta["labels"][REPLICA_INDEX_LABEL] = "0"
    spec = template["spec"]
    spec.update(hostname=f"{name}-launcher", subdomain=name)
    if spec.get("hostNetwork"):
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    container = spec["containers"][0]
    env = [*(container.get("env") or []), {"name": "K_MPI_JOB_ROLE", "value": "launcher"}]
    slots = str(job["spec"]["slotsPerWorker"])
    implementation = job["spec"]["mpiImplementation"]
    if implementation == "OpenMPI":
        env += [*OMPI_ENV, {"name": "OMPI_MCA_orte_set_default_slots", "value": slots}]
    elif implementation == "Intel":
        env += [*INTEL_ENV, {"name": "I_MPI_PERHOST", "value": slots}]
    else:
        env += MPICH_ENV
    if not launcher_as_worker(job):
        env += NVIDIA_BLANK
    container["env"] = copy.deepcopy(env)
    _setup_ssh(spec, job)
    warnings = []
    if spec.get("restartPolicy"):
        warnings.append("Restart policy in pod template overridden by restart policy in replica spec")
    spec["restartPolicy"] = replica["restartPolicy"]
    config = {"name": f"{name}-config", "items": copy.deepcopy(CONFIG_ITEMS)}
    spec.setdefault("volumes", []).append({"name": "mpi-job-config", "configMap": config})
    container.setdefault("volumeMounts", []).append({"name": "mpi-job-config", "mountPath": CONFIG_MOUNT})
    out_meta: Obj = {"labels": meta["labels"], "ownerReferences": [controller_ref(job)]}
    if meta.get("annotations"):
        out_meta["annotations"] = meta["annotations"]
    return {"metadata": out_meta, "spec": spec}, warnings


def launcher_job(job: Obj, template: Obj) -> Obj:
    """batch/v1 Job ``<job>-launcher``: runPolicy's deadline, backoffLimit and TTL go here only."""
    name = job["metadata"]["name"]
    policy = job["spec"].get("runPolicy") or {}
    spec: Obj = {"template": template, "podReplacementPolicy": "Failed"}
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if policy.get(key) is not None:
            spec[key] = policy[key]
    if suspended(job):
        spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{name}-launcher", "labels": {"app": name}, "ownerReferences": [controller_ref(job)]},
        "spec": spec,
    }


def pod_group(job: Obj, gang_scheduler: str) -> tuple[str, Obj]:
    """The PodGroup ``<job>`` (Volcano's or coscheduling's) and its API version: minMember is
    schedulingPolicy.minAvailable, else workers + 1."""
    policy = (job["spec"].get("runPolicy") or {}).get("schedulingPolicy") or {}
    name = job["metadata"]["name"]
    members = policy.get("minAvailable", worker_replicas(job) + 1)
    spec: Obj = {"minMember": members}
    if gang_scheduler == "volcano":
        api = "scheduling.volcano.sh/v1beta1"
        queue = (job["metadata"].get("annotations") or {}).get("scheduling.volcano.sh/queue-name", "")
        if policy.get("queue"):
            queue = policy["queue"]
        if queue:
            spec["queue"] = queue
        if policy.get("priorityClass"):
            spec["priorityClassName"] = policy["priorityClass"]
    else:
        api = "scheduling.x-k8s.io/v1alpha1"
        if policy.get("scheduleTimeoutSeconds") is not None:
            spec["scheduleTimeoutSeconds"] = policy["scheduleTimeoutSeconds"]
    body = {
        "apiVersion": api,
        "kind": "PodGroup",
        "metadata": {"name": name, "ownerReferences": [controller_ref(job)]},
        "spec": spec,
    }
    return api, body


# --- status --------------------------------------------------------------------------------------


def condition(status: Obj, kind: str) -> Obj | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def has_true(status: Obj, kind: str) -> bool:
    found = condition(status, kind)
    return found is not None and found.get("status") == "True"


def finished(status: Obj) -> bool:
    return has_true(status, "Succeeded") or has_true(status, "Failed")


def set_condition(status: Obj, kind: str, value: str, reason: str, message: str) -> bool:
    """``setCondition``: nothing when type, status and reason are unchanged; a finishing
    condition turns Running (and an earlier Failed) False."""
    current = condition(status, kind)
    if current is not None and current.get("status") == value and current.get("reason") == reason:
        return False
    stamp = now()
    new = {"type": kind, "status": value, "reason": reason, "message": message}
    new.update(lastUpdateTime=stamp, lastTransitionTime=stamp)
    if current is not None and current.get("status") == value:
        new["lastTransitionTime"] = current.get("lastTransitionTime", stamp)
    kept = []
    for old in status.get("conditions") or []:
        if old.get("type") == kind:
            continue
        if kind in ("Failed", "Succeeded") and old.get("type") in ("Running", "Failed"):
            old = {**old, "status": "False"}
        kept.append(old)
    status["conditions"] = [*kept, new]
    return True


def replica_status(active: int = 0, succeeded: int = 0, failed: int = 0) -> Obj:
    """A ReplicaStatus as JSON: zero counts are omitted (``omitempty``)."""
    counts = {"active": active, "succeeded": succeeded, "failed": failed}
    return {key: value for key, value in counts.items() if value}


def pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def pod_ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )
