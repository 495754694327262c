"""The PodSecurity admission's checks, for the Kubernetes API double (pure: no I/O).

Clusters that enforce the Pod Security Standards label a namespace
``pod-security.kubernetes.io/enforce: baseline|restricted``; the API server then refuses a pod
that breaks the level with ``403 Forbidden`` and ``pods "x" is forbidden: violates PodSecurity
"restricted:latest": <reason> (<detail>), ...``. This module gives the same verdict and the same
words, read from the admission's own source (k8s.io/pod-security-admission, policy/check_*.go):
the checks of the latest policy version, each reason and detail phrased as there, in its order
(baseline checks, then restricted ones, each group sorted by check ID, as the registry orders
them).

Covered: baseline ``capabilities_baseline``, ``hostNamespaces``, ``hostPathVolumes``,
``hostPorts``, ``privileged``, ``seccompProfile_baseline``; restricted
``allowPrivilegeEscalation``, ``capabilities_restricted``, ``restrictedVolumes``,
``runAsNonRoot``, ``runAsUser``, ``seccompProfile_restricted`` (the last four relaxed for
``hostUsers: false``, as since 1.35). Not covered, since no pod of ours sets the fields they
look at: AppArmor, SELinux options, procMount, sysctls, host probes, Windows host processes.
A version label other than ``latest`` is echoed in the message but checked with the latest rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_VOLUME_SOURCES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
# Inline volume sources the restricted level refuses, by the name the admission reports.
OTHER_VOLUME_SOURCES = (
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
)
VALID_SECCOMP = ("RuntimeDefault", "Localhost")


@dataclass(frozen=True)
class Violation:
    """One failed check: the reason (e.g. ``runAsNonRoot != true``) and its detail."""

    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})" if self.detail else self.reason


# --- the namespace's policy -------------------------------------------------------------------


def enforced_level(namespace_labels: Mapping[str, str]) -> tuple[str, str]:
    """``(level, version)`` the namespace enforces. No label: ``privileged`` (nothing refused);
    an unknown level is read as ``restricted`` and an unknown version as ``latest``, as the
    admission does (it fails closed)."""
    level = namespace_labels.get(ENFORCE_LABEL, "privileged")
    if level not in LEVELS:
        level = "restricted"
    version = namespace_labels.get(ENFORCE_VERSION_LABEL, "latest")
    if version != "latest" and not _is_minor_version(version):
        version = "latest"
    return level, version


def _is_minor_version(version: str) -> bool:
    prefix, _, minor = version.partition("v1.")
    return not prefix and minor.isdigit() and (minor == "0" or not minor.startswith("0"))


def admission_denial(name: str, pod: Obj, namespace_labels: Mapping[str, str]) -> str | None:
    """The message of the 403 the PodSecurity admission answers for ``pod`` in a namespace with
    these labels, or ``None`` when the pod is admitted."""
    level, version = enforced_level(namespace_labels)
    violations = check_pod(level, pod)
    if not violations:
        return None
    details = ", ".join(str(v) for v in violations)
    return f'pods "{name}" is forbidden: violates PodSecurity "{level}:{version}": {details}'


def check_pod(level: str, pod: Obj) -> list[Violation]:
    """Every check of ``level`` the pod fails, in the admission's order."""
    if level == "privileged":
        return []
    checks = BASELINE_CHECKS if level == "baseline" else RESTRICTED_CHECKS
    spec = pod.get("spec") or {}
    return [violation for check in checks if (violation := check(spec)) is not None]


# --- helpers ----------------------------------------------------------------------------------


def _containers(spec: Obj) -> Iterator[Obj]:
    """Init containers, containers and ephemeral containers, as the admission visits them."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _name(container: Obj) -> str:
    return str(container.get("name", ""))


def _context(container: Obj) -> Obj:
    return container.get("securityContext") or {}


def _pod_context(spec: Obj) -> Obj:
    return spec.get("securityContext") or {}


def _quote(items: list[str]) -> str:
    return ", ".join(f'"{item}"' for item in items)


def _containers_word(count: int) -> str:
    return "container" if count == 1 else "containers"


def _relaxed_for_user_namespace(spec: Obj) -> bool:
    return spec.get("hostUsers") is False


def _setters(pod_bad: bool, containers: list[str]) -> str:
    """``pod``, ``container "a"``, ``pod and containers "a", "b"``: who set a forbidden value."""
    setters = ["pod"] if pod_bad else []
    if containers:
        setters.append(f"{_containers_word(len(containers))} {_quote(containers)}")
    return " and ".join(setters)


# --- baseline checks --------------------------------------------------------------------------


def _capabilities_baseline(spec: Obj) -> Violation | None:
    bad: list[str] = []
    added: set[str] = set()
    for container in _containers(spec):
        capabilities = _context(container).get("capabilities") or {}
        extra = [c for c in capabilities.get("add") or [] if c not in BASELINE_CAPABILITIES]
        if extra:
            bad.append(_name(container))
            added.update(extra)
    if not bad:
        return None
    return Violation(
        "non-default capabilities",
        f"{_containers_word(len(bad))} {_quote(bad)} must not include {_quote(sorted(added))} "
        "in securityContext.capabilities.add",
    )


def _host_namespaces(spec: Obj) -> Violation | None:
    used = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return Violation("host namespaces", ", ".join(used)) if used else None


def _host_path_volumes(spec: Obj) -> Violation | None:
    names = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if not names:
        return None
    return Violation("hostPath volumes", f"{'volume' if len(names) == 1 else 'volumes'} {_quote(names)}")


def _host_ports(spec: Obj) -> Violation | None:
    bad: list[str] = []
    ports: set[str] = set()
    for container in _containers(spec):
        used = [p["hostPort"] for p in container.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(_name(container))
            ports.update(str(p) for p in used)
    if not bad:
        return None
    return Violation(
        "hostPort",
        f"{_containers_word(len(bad))} {_quote(bad)} {'uses' if len(bad) == 1 else 'use'} "
        f"{'hostPort' if len(ports) == 1 else 'hostPorts'} {', '.join(sorted(ports))}",
    )


def _privileged(spec: Obj) -> Violation | None:
    bad = [_name(c) for c in _containers(spec) if _context(c).get("privileged")]
    if not bad:
        return None
    return Violation(
        "privileged", f"{_containers_word(len(bad))} {_quote(bad)} must not set securityContext.privileged=true"
    )


def _seccomp_explicitly_bad(spec: Obj) -> tuple[bool, list[str], set[str]]:
    values: set[str] = set()
    pod_profile = _pod_context(spec).get("seccompProfile")
    pod_bad = pod_profile is not None and pod_profile.get("type") not in VALID_SECCOMP
    if pod_profile is not None and pod_bad:
        values.add(str(pod_profile.get("type")))
    bad: list[str] = []
    for container in _containers(spec):
        profile = _context(container).get("seccompProfile")
        if profile is not None and profile.get("type") not in VALID_SECCOMP:
            bad.append(_name(container))
            values.add(str(profile.get("type")))
    return pod_bad, bad, values


def _seccomp_baseline(spec: Obj) -> Violation | None:
    pod_bad, bad, values = _seccomp_explicitly_bad(spec)
    if not (pod_bad or bad):
        return None
    return Violation(
        "seccompProfile",
        f"{_setters(pod_bad, bad)} must not set securityContext.seccompProfile.type to {_quote(sorted(values))}",
    )


# --- restricted checks ------------------------------------------------------------------------


def _allow_privilege_escalation(spec: Obj) -> Violation | None:
    bad = [_name(c) for c in _containers(spec) if _context(c).get("allowPrivilegeEscalation") is not False]
    if not bad:
        return None
    return Violation(
        "allowPrivilegeEscalation != false",
        f"{_containers_word(len(bad))} {_quote(bad)} must set securityContext.allowPrivilegeEscalation=false",
    )


def _capabilities_restricted(spec: Obj) -> Violation | None:
    missing_drop: list[str] = []
    adding: list[str] = []
    forbidden: set[str] = set()
    for container in _containers(spec):
        capabilities = _context(container).get("capabilities")
        if capabilities is None:
            missing_drop.append(_name(container))
            continue
        if "ALL" not in (capabilities.get("drop") or []):
            missing_drop.append(_name(container))
        extra = [c for c in capabilities.get("add") or [] if c != "NET_BIND_SERVICE"]
        if extra:
            adding.append(_name(container))
            forbidden.update(extra)
    details = []
    if missing_drop:
        details.append(
            f"{_containers_word(len(missing_drop))} {_quote(missing_drop)} "
            'must set securityContext.capabilities.drop=["ALL"]'
        )
    if adding:
        details.append(
            f"{_containers_word(len(adding))} {_quote(adding)} must not include {_quote(sorted(forbidden))} "
            "in securityContext.capabilities.add"
        )
    return Violation("unrestricted capabilities", "; ".join(details)) if details else None


def _restricted_volumes(spec: Obj) -> Violation | None:
    bad: list[str] = []
    kinds: set[str] = set()
    for volume in spec.get("volumes") or []:
        if any(source in volume for source in RESTRICTED_VOLUME_SOURCES):
            continue
        bad.append(volume["name"])
        kinds.add(next((source for source in OTHER_VOLUME_SOURCES if source in volume), "unknown"))
    if not bad:
        return None
    one = len(bad) == 1
    return Violation(
        "restricted volume types",
        f"{'volume' if one else 'volumes'} {_quote(bad)} {'uses' if one else 'use'} "
        f"{'restricted volume type' if len(kinds) == 1 else 'restricted volume types'} {_quote(sorted(kinds))}",
    )


def _run_as_non_root(spec: Obj) -> Violation | None:
    if _relaxed_for_user_namespace(spec):
        return None
    pod_value = _pod_context(spec).get("runAsNonRoot")
    explicitly_bad: list[str] = []
    implicitly_bad: list[str] = []
    for container in _containers(spec):
        value = _context(container).get("runAsNonRoot")
        if value is not None:
            if not value:
                explicitly_bad.append(_name(container))
        elif pod_value is not True:
            implicitly_bad.append(_name(container))
    if pod_value is False or explicitly_bad:
        return Violation(
            "runAsNonRoot != true",
            f"{_setters(pod_value is False, explicitly_bad)} must not set securityContext.runAsNonRoot=false",
        )
    if implicitly_bad:
        return Violation(
            "runAsNonRoot != true",
            f"pod or {_containers_word(len(implicitly_bad))} {_quote(implicitly_bad)} "
            "must set securityContext.runAsNonRoot=true",
        )
    return None


def _run_as_user(spec: Obj) -> Violation | None:
    if _relaxed_for_user_namespace(spec):
        return None
    pod_bad = _pod_context(spec).get("runAsUser") == 0
    bad = [_name(c) for c in _containers(spec) if _context(c).get("runAsUser") == 0]
    if not (pod_bad or bad):
        return None
    return Violation("runAsUser=0", f"{_setters(pod_bad, bad)} must not set runAsUser=0")


def _seccomp_restricted(spec: Obj) -> Violation | None:
    pod_bad, bad, values = _seccomp_explicitly_bad(spec)
    if pod_bad or bad:
        return Violation(
            "seccompProfile",
            f"{_setters(pod_bad, bad)} must not set securityContext.seccompProfile.type to {_quote(sorted(values))}",
        )
    pod_set = _pod_context(spec).get("seccompProfile") is not None
    unset = [_name(c) for c in _containers(spec) if _context(c).get("seccompProfile") is None and not pod_set]
    if not unset:
        return None
    return Violation(
        "seccompProfile",
        f"pod or {_containers_word(len(unset))} {_quote(unset)} must set securityContext.seccompProfile.type "
        'to "RuntimeDefault" or "Localhost"',
    )


Check = Callable[[Obj], "Violation | None"]

# By check ID: appArmorProfile, capabilities_baseline, hostNamespaces, hostPathVolumes, hostPorts,
# hostProbesAndHostLifecycle, privileged, procMount, seLinuxOptions, seccompProfile_baseline, ...
BASELINE_CHECKS: tuple[Check, ...] = (
    _capabilities_baseline,
    _host_namespaces,
    _host_path_volumes,
    _host_ports,
    _privileged,
    _seccomp_baseline,
)
# The baseline checks the restricted ones replace (capabilities, hostPath volumes, seccomp) drop
# out; then allowPrivilegeEscalation, capabilities_restricted, procMount_restricted,
# restrictedVolumes, runAsNonRoot, runAsUser, seccompProfile_restricted.
RESTRICTED_CHECKS: tuple[Check, ...] = (
    _host_namespaces,
    _host_ports,
    _privileged,
    _allow_privilege_escalation,
    _capabilities_restricted,
    _restricted_volumes,
    _run_as_non_root,
    _run_as_user,
    _seccomp_restricted,
)
