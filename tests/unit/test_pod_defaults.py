"""Every kind's pods carry the same secure defaults: the runtime's default seccomp profile on the
pod and no privilege escalation in its container, whether we create the pods (plain, a gang) or
a controller makes them from our template (Volcano, MPIJob, TrainJob); a job without root gets
the restricted profile's fields as well."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.kinds.registry import job_kind
from airflow_mpi.spec import MPIJobSpec

Obj = dict[str, Any]


def pod_specs(value: Any) -> Iterator[Obj]:
    """Every pod spec (a mapping with ``containers``) anywhere in a rendered object."""
    if isinstance(value, dict):
        if "containers" in value:
            yield value
        for item in value.values():
            yield from pod_specs(item)
    elif isinstance(value, list):
        for item in value:
            yield from pod_specs(item)


def rendered(kind: str, **fields: Any) -> list[Obj]:
    data: dict[str, Any] = {
        "name": "sec",
        "image": "registry.example/train:1",
        "command": ["python", "/app/train.py"],
        "workers": {"replicas": 2},
        **fields,
    }
    plan = job_kind(kind).render_plan(MPIJobSpec.from_dict(data), RunIdentity("d", "t", "r"))
    return job_kind(kind).render(plan, "ml")


CASES = [
    ("pods", {}),
    ("pods", {"scheduling": {"gang": "volcano"}}),
    ("pods", {"scheduling": {"gang": "coscheduling"}}),
    ("pods", {"scheduling": {"gang": "kueue", "queue": "q"}}),
    ("volcano", {}),
    ("mpijob", {}),
    ("trainjob", {}),
]


@pytest.mark.parametrize(
    ("kind", "fields"), CASES, ids=[f"{k}-{f.get('scheduling', {}).get('gang', '')}" for k, f in CASES]
)
def test_every_pod_of_every_kind_gets_seccomp_and_no_privilege_escalation(kind: str, fields: dict[str, Any]) -> None:
    specs = [spec for obj in rendered(kind, **fields) for spec in pod_specs(obj)]
    assert len(specs) >= 2, kind  # the master's and the workers'
    for spec in specs:
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("kind", ["pods", "volcano", "mpijob", "trainjob"])
def test_a_job_without_root_gets_the_restricted_fields_in_every_kind(kind: str) -> None:
    specs = [spec for obj in rendered(kind, pod={"run_as_user": 1000}, ssh_port=2222) for spec in pod_specs(obj)]
    for spec in specs:
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
