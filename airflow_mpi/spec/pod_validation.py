"""The rules of the pod settings: Kubernetes names, labels, tolerations and volumes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_mpi.contract import DEFAULT_PATHS, MAX_DNS_LABEL
from airflow_mpi.exceptions import SpecIssue
from airflow_mpi.spec.formats import (
    CONTROL,
    DNS1123_LABEL,
    DNS_SUBDOMAIN,
    MAX_ANNOTATION_BYTES,
    MAX_DNS_SUBDOMAIN,
    is_dns_label,
    is_label_value,
    is_qualified_name,
)
from airflow_mpi.spec.quantities import check_memory

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec

# Label keys airflow-mpi sets on every object of a job (naming.build_job_labels).
OWNED_LABEL_PREFIXES = ("airflow-mpi.io/", "app.kubernetes.io/")
OWNED_ANNOTATION_PREFIX = "airflow-mpi.io/"  # the marks airflow-mpi keeps on a job's objects
PULL_POLICIES = {"Always", "IfNotPresent", "Never"}
TOLERATION_OPERATORS = {"Equal", "Exists"}
TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}


def check_pod(spec: MPIJobSpec) -> list[SpecIssue]:
    pod = spec.pod
    issues = []
    if pod.namespace is not None and not (len(pod.namespace) <= MAX_DNS_LABEL and DNS1123_LABEL.match(pod.namespace)):
        issues.append(SpecIssue("pod.namespace", f"{pod.namespace!r} is not a namespace name", "use a DNS-1123 label"))
    issues += _check_label_map("pod.node_selector", pod.node_selector)
    issues += _check_label_map("pod.labels", pod.labels)
    for key in pod.labels:
        if key.startswith(OWNED_LABEL_PREFIXES):
            issues.append(
                SpecIssue(
                    f"pod.labels.{key}",
                    "is set by airflow-mpi on every object of the job (it finds and removes the job by them)",
                    "use a label key of your own prefix, e.g. 'team.example.com/owner'",
                )
            )
    for key, value in pod.annotations.items():
        if not is_qualified_name(key):
            issues.append(SpecIssue(f"pod.annotations.{key}", "is not a valid annotation key", "use [prefix/]name"))
        elif key.startswith(OWNED_ANNOTATION_PREFIX):
            issues.append(
                SpecIssue(
                    f"pod.annotations.{key}",
                    "uses the prefix airflow-mpi.io/ of the marks airflow-mpi keeps on the job's objects (such as "
                    "how much of the log was shown); a copy of yours would preset them",
                    "use an annotation key of your own prefix, e.g. 'team.example.com/owner'",
                )
            )
        if not isinstance(value, str):
            issues.append(SpecIssue(f"pod.annotations.{key}", f"value {value!r} is not text", f"quote it: '{value}'"))
    size = sum(len(key.encode()) + len(str(value).encode()) for key, value in pod.annotations.items())
    if size > MAX_ANNOTATION_BYTES:
        issues.append(
            SpecIssue(
                "pod.annotations",
                f"hold {size} bytes; Kubernetes allows 262144 per object and the job needs 4096 of them",
                f"keep them under {MAX_ANNOTATION_BYTES} bytes (put large data in a ConfigMap)",
            )
        )
    for index, toleration in enumerate(pod.tolerations):
        path = f"pod.tolerations[{index}]"
        if toleration.operator not in TOLERATION_OPERATORS:
            issues.append(SpecIssue(f"{path}.operator", f"{toleration.operator!r}", "use 'Equal' or 'Exists'"))
        if toleration.effect is not None and toleration.effect not in TOLERATION_EFFECTS:
            issues.append(
                SpecIssue(f"{path}.effect", f"{toleration.effect!r}", f"use one of {sorted(TOLERATION_EFFECTS)}")
            )
        if toleration.operator == "Exists" and toleration.value:
            issues.append(SpecIssue(f"{path}.value", "must be empty with operator Exists", "remove it"))
        if not toleration.key and toleration.operator != "Exists":
            issues.append(
                SpecIssue(f"{path}.key", "is empty with operator Equal", "give a key, or use operator Exists")
            )
        if toleration.key and not is_qualified_name(toleration.key):
            issues.append(
                SpecIssue(
                    f"{path}.key", f"{toleration.key!r} is not a taint key", "use [prefix/]name, name <= 63 chars"
                )
            )
        if toleration.operator == "Equal" and toleration.value and not is_label_value(toleration.value):
            issues.append(
                SpecIssue(f"{path}.value", f"{toleration.value!r} is not a taint value", "use <= 63 of [A-Za-z0-9._-]")
            )
        if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
            issues.append(
                SpecIssue(
                    f"{path}.toleration_seconds",
                    f"is set with effect {toleration.effect!r}; it only bounds how long a NoExecute taint is tolerated",
                    "set effect: NoExecute, or remove toleration_seconds",
                )
            )
    reserved_mounts = {DEFAULT_PATHS.config_dir, DEFAULT_PATHS.ssh_secret_dir, DEFAULT_PATHS.runtime_dir}
    if pod.shm_size:
        reserved_mounts.add("/dev/shm")
    seen_names: set[str] = set()
    seen_paths: set[str] = set()
    for index, volume in enumerate(pod.volumes):
        path = f"pod.volumes[{index}]"
        if not is_dns_label(volume.name) or volume.name in {"mpi-config", "mpi-ssh", "mpi-runtime", "dshm"}:
            issues.append(
                SpecIssue(f"{path}.name", f"{volume.name!r} is not a free DNS-1123 label", "use another name")
            )
        if volume.name in seen_names:
            issues.append(SpecIssue(f"{path}.name", f"{volume.name!r} is used twice", "give each volume its own name"))
        seen_names.add(volume.name)
        if not volume.mount_path.startswith("/"):
            issues.append(SpecIssue(f"{path}.mount_path", f"{volume.mount_path!r} is not absolute", "use a pod path"))
        mount = volume.mount_path.rstrip("/") or "/"
        clash = [r for r in reserved_mounts if mount == r or r.startswith(mount + "/") or mount.startswith(r + "/")]
        if clash or mount == "/":
            issues.append(
                SpecIssue(
                    f"{path}.mount_path", f"{mount!r} overlaps {clash or ['/']} used by the job", "mount elsewhere"
                )
            )
        if mount in seen_paths:
            issues.append(SpecIssue(f"{path}.mount_path", f"{mount!r} is mounted twice", "use one volume per path"))
        seen_paths.add(mount)
        if len(volume.sources) != 1:
            issues.append(
                SpecIssue(
                    path,
                    f"has {len(volume.sources)} sources {list(volume.sources)}",
                    "give exactly one of host_path, persistent_volume_claim, config_map, secret, empty_dir",
                )
            )
        if volume.host_path is not None and not volume.host_path.startswith("/"):
            issues.append(
                SpecIssue(f"{path}.host_path", f"{volume.host_path!r} is not absolute", "use an absolute path")
            )
        if volume.host_path is not None and ".." in volume.host_path.split("/"):
            issues.append(SpecIssue(f"{path}.host_path", f"{volume.host_path!r} contains '..'", "give the path itself"))
        for key in ("mount_path", "host_path", "sub_path"):
            value = getattr(volume, key)
            if value is not None and CONTROL.search(value):
                issues.append(SpecIssue(f"{path}.{key}", f"{value!r} contains a control character", "use a plain path"))
        if volume.sub_path is not None and (
            volume.sub_path.startswith("/") or ".." in volume.sub_path.split("/") or not volume.sub_path
        ):
            issues.append(
                SpecIssue(
                    f"{path}.sub_path",
                    f"{volume.sub_path!r} is not a relative path inside the volume",
                    "use a relative path without '..', e.g. 'datasets/digits'",
                )
            )
        for key in ("persistent_volume_claim", "config_map", "secret"):
            value = getattr(volume, key)
            if value and not (len(value) <= 253 and DNS_SUBDOMAIN.match(value)):
                issues.append(
                    SpecIssue(f"{path}.{key}", f"{value!r} is not an object name", "use the name of an existing one")
                )
    for index, secret in enumerate(pod.image_pull_secrets):
        if not DNS_SUBDOMAIN.match(secret):
            issues.append(SpecIssue(f"pod.image_pull_secrets[{index}]", f"{secret!r} is not a Secret name", "fix it"))
    if pod.image_pull_policy is not None and pod.image_pull_policy not in PULL_POLICIES:
        issues.append(
            SpecIssue("pod.image_pull_policy", f"{pod.image_pull_policy!r}", f"use one of {sorted(PULL_POLICIES)}")
        )
    for key in ("service_account", "priority_class"):
        value = getattr(pod, key)
        if value is not None and (len(value) > MAX_DNS_SUBDOMAIN or not DNS_SUBDOMAIN.match(value)):
            issues.append(SpecIssue(f"pod.{key}", f"{value!r} is not a valid object name", "use a DNS-1123 name"))
    if pod.shm_size is not None:
        issues += check_memory("pod.shm_size", pod.shm_size, "'2Gi'")
    return issues


def _check_label_map(path: str, labels: Mapping[str, str]) -> list[SpecIssue]:
    issues = []
    for key, value in labels.items():
        if not is_qualified_name(key):
            issues.append(SpecIssue(f"{path}.{key}", "is not a valid label key", "use [prefix/]name, name <= 63 chars"))
        if not isinstance(value, str) or not is_label_value(value):
            issues.append(
                SpecIssue(f"{path}.{key}", f"value {value!r} is not a valid label value", "use <= 63 of [A-Za-z0-9._-]")
            )
    return issues
