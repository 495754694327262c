"""The API double's PodSecurity admission: every check fires with the admission's own words, in its
order; the namespace labels choose the level as the admission reads them; the module is pure."""

from __future__ import annotations

import ast
import copy
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.doubles import podsecurity
from tests.doubles.podsecurity import admission_denial, check_pod, enforced_level

RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}

# A pod that passes "restricted": the shape airflow-mpi renders for a job without root.
GOOD: dict[str, Any] = {
    "metadata": {"name": "p"},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "mpi",
                "ports": [{"containerPort": 2222}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [{"name": "cfg", "configMap": {"name": "c"}}, {"name": "run", "emptyDir": {}}],
    },
}


def pod_with(change: Any) -> dict[str, Any]:
    pod = copy.deepcopy(GOOD)
    change(pod["spec"])
    return pod


def container(spec: dict[str, Any]) -> dict[str, Any]:
    return dict(spec["containers"][0])


def test_the_good_pod_passes_every_level() -> None:
    for level in ("privileged", "baseline", "restricted"):
        assert check_pod(level, GOOD) == []


# Each case breaks one rule; the admission's reason and detail, word for word.
CASES: list[tuple[str, Any, str, str]] = [
    (
        "allowPrivilegeEscalation unset",
        lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation != false",
        'container "mpi" must set securityContext.allowPrivilegeEscalation=false',
    ),
    (
        "capabilities not dropped",
        lambda s: s["containers"][0]["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
        "unrestricted capabilities",
        'container "mpi" must set securityContext.capabilities.drop=["ALL"]',
    ),
    (
        "a capability added",
        lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN", "NET_BIND_SERVICE"]),
        "unrestricted capabilities",  # restricted's check replaces baseline's "non-default capabilities"
        'container "mpi" must not include "SYS_ADMIN" in securityContext.capabilities.add',
    ),
    (
        "runAsNonRoot unset",
        lambda s: s["securityContext"].pop("runAsNonRoot"),
        "runAsNonRoot != true",
        'pod or container "mpi" must set securityContext.runAsNonRoot=true',
    ),
    (
        "runAsNonRoot false on the pod",
        lambda s: s["securityContext"].update(runAsNonRoot=False),
        "runAsNonRoot != true",
        "pod must not set securityContext.runAsNonRoot=false",
    ),
    (
        "runAsUser 0 on the container",
        lambda s: s["containers"][0]["securityContext"].update(runAsUser=0),
        "runAsUser=0",
        'container "mpi" must not set runAsUser=0',
    ),
    (
        "seccompProfile unset",
        lambda s: s["securityContext"].pop("seccompProfile"),
        "seccompProfile",
        'pod or container "mpi" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
    ),
    (
        "seccompProfile Unconfined",
        lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "seccompProfile",
        'pod must not set securityContext.seccompProfile.type to "Unconfined"',
    ),
    (
        "a hostPath volume",
        lambda s: s["volumes"].append({"name": "ckpt", "hostPath": {"path": "/mnt"}}),
        "restricted volume types",
        'volume "ckpt" uses restricted volume type "hostPath"',
    ),
    (
        "host network",
        lambda s: s.update(hostNetwork=True, hostPID=True),
        "host namespaces",
        "hostNetwork=true, hostPID=true",
    ),
    (
        "a host port",
        lambda s: s["containers"][0]["ports"][0].update(hostPort=2222),
        "hostPort",
        'container "mpi" uses hostPort 2222',
    ),
    (
        "privileged",
        lambda s: s["containers"][0]["securityContext"].update(privileged=True),
        "privileged",
        'container "mpi" must not set securityContext.privileged=true',
    ),
]


@pytest.mark.parametrize(("case", "change", "reason", "detail"), CASES, ids=[c[0] for c in CASES])
def test_each_restricted_rule_fires(case: str, change: Any, reason: str, detail: str) -> None:
    violations = check_pod("restricted", pod_with(change))
    assert (violations[0].reason, violations[0].detail) == (reason, detail)


def test_baseline_refuses_only_its_own_rules() -> None:
    assert check_pod("baseline", pod_with(lambda s: s["securityContext"].clear())) == []
    (violation,) = check_pod("baseline", pod_with(lambda s: s["volumes"].append({"name": "d", "hostPath": {}})))
    assert str(violation) == 'hostPath volumes (volume "d")'
    (violation,) = check_pod(
        "baseline",
        pod_with(lambda s: s["containers"][0]["securityContext"].update(capabilities={"add": ["NET_ADMIN"]})),
    )
    assert violation.reason == "non-default capabilities"
    seccomp = pod_with(lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}))
    assert [v.reason for v in check_pod("baseline", seccomp)] == ["seccompProfile"]


def test_the_root_pod_gets_the_admissions_whole_message() -> None:
    def root(spec: dict[str, Any]) -> None:
        spec.pop("securityContext")
        spec["containers"][0].pop("securityContext")

    message = admission_denial("job-worker-0", pod_with(root), RESTRICTED)
    assert message == (
        'pods "job-worker-0" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "mpi" must set securityContext.allowPrivilegeEscalation=false), '
        'unrestricted capabilities (container "mpi" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "mpi" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "mpi" must set securityContext.seccompProfile.type to "RuntimeDefault" '
        'or "Localhost")'
    )
    assert admission_denial("job-worker-0", GOOD, RESTRICTED) is None


def test_several_containers_are_named_together() -> None:
    def two(spec: dict[str, Any]) -> None:
        spec["initContainers"] = [{"name": "init"}]
        spec["containers"][0].pop("securityContext")

    (violation, *_) = check_pod("restricted", pod_with(two))
    assert violation.detail == 'containers "init", "mpi" must set securityContext.allowPrivilegeEscalation=false'


def test_a_user_namespace_relaxes_the_root_rules() -> None:
    def userns(spec: dict[str, Any]) -> None:
        spec["hostUsers"] = False
        spec["securityContext"].update(runAsNonRoot=False, runAsUser=0)

    assert check_pod("restricted", pod_with(userns)) == []


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, ("privileged", "latest")),
        ({"pod-security.kubernetes.io/enforce": "baseline"}, ("baseline", "latest")),
        ({**RESTRICTED, "pod-security.kubernetes.io/enforce-version": "v1.30"}, ("restricted", "v1.30")),
        ({**RESTRICTED, "pod-security.kubernetes.io/enforce-version": "1.30"}, ("restricted", "latest")),
        ({"pod-security.kubernetes.io/enforce": "strict"}, ("restricted", "latest")),  # fails closed
        ({"pod-security.kubernetes.io/warn": "restricted"}, ("privileged", "latest")),  # only enforce refuses
    ],
)
def test_namespace_labels_choose_the_level(labels: dict[str, str], expected: tuple[str, str]) -> None:
    assert enforced_level(labels) == expected


def test_the_version_label_is_in_the_message() -> None:
    labels = {**RESTRICTED, "pod-security.kubernetes.io/enforce-version": "v1.30"}
    message = admission_denial("p", pod_with(lambda s: s.pop("securityContext")), labels) or ""
    assert message.startswith('pods "p" is forbidden: violates PodSecurity "restricted:v1.30": runAsNonRoot != true')


def test_the_module_is_pure() -> None:
    tree = ast.parse(Path(podsecurity.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in imported} <= {"__future__", "collections", "dataclasses", "typing"}
    assert {"collections", "dataclasses", "typing"} <= set(sys.stdlib_module_names)
