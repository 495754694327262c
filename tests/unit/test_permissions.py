"""The permission check before create: which verbs a rules review lacks, and the RBAC guide's Role
being exactly what the plain pods backend checks for."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_mpi.kinds.permissions import (
    GANG_RULES,
    POD_BACKEND_RULES,
    WATCHDOG_RULES,
    Permission,
    build_permissions,
    missing_permissions,
    render_missing,
)
from tests.documented import documented_added_rules, documented_role_rules


def test_the_documented_role_is_what_the_backend_checks_for() -> None:
    assert sorted(build_permissions(documented_role_rules())) == sorted(build_permissions(POD_BACKEND_RULES))


def test_what_the_guide_says_each_backend_and_gang_adds_is_what_is_checked() -> None:
    from airflow_mpi.kinds.registry import BACKEND_OF_KIND
    from airflow_mpi.kinds.strategy import registered_kinds

    documented = documented_added_rules()
    expected = {f"backend: {BACKEND_OF_KIND[k.name]}": k.rules for k in registered_kinds().values() if k.rules}
    expected.update({f"gang: {gang}": rules for gang, rules in GANG_RULES.items()})
    expected["progress_timeout"] = WATCHDOG_RULES
    assert set(documented) == set(expected)
    for name, rules in expected.items():
        assert sorted(build_permissions(documented[name])) == sorted(build_permissions(rules)), name


def test_each_kind_checks_the_role_and_what_it_and_its_gang_add() -> None:
    from airflow_mpi.kinds.strategy import job_kind
    from airflow_mpi.spec import MPIJobSpec

    base = set(build_permissions(POD_BACKEND_RULES))
    plain = MPIJobSpec.from_dict({"name": "p", "command": ["true"]})
    gang = MPIJobSpec.from_dict({"name": "p", "command": ["true"], "scheduling": {"gang": "coscheduling"}})
    assert set(job_kind("pods").permissions(plain)) == base
    assert set(job_kind("pods").permissions(gang)) - base == {
        Permission("scheduling.x-k8s.io", "podgroups", verb) for verb in ("create", "get", "list", "delete")
    }
    assert Permission("kubeflow.org", "mpijobs", "create") in job_kind("mpijob").permissions(plain)
    assert Permission("", "secrets", "update") in job_kind("mpijob").permissions(plain)
    assert Permission("batch.volcano.sh", "jobs", "delete") in job_kind("volcano").permissions(plain)
    # The hang watchdog execs into the pods: only a job that sets progress_timeout needs it.
    watched = MPIJobSpec.from_dict({"name": "p", "command": ["true"], "progress_timeout": 60})
    for kind in ("pods", "volcano", "mpijob"):
        assert set(job_kind(kind).permissions(watched)) - set(job_kind(kind).permissions(plain)) == {
            Permission("", "pods/exec", "create"),
            Permission("", "pods/exec", "get"),
        }


EVERYTHING = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
PODS = [Permission("", "pods", "create"), Permission("", "pods", "list"), Permission("", "pods/log", "get")]


@pytest.mark.parametrize(
    ("granted", "missing"),
    [
        (EVERYTHING, []),
        (list(POD_BACKEND_RULES), []),
        ([{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}], [Permission("", "pods/log", "get")]),
        ([{"apiGroups": [""], "resources": ["*"], "verbs": ["create", "list", "get"]}], []),
        ([{"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]}], PODS),  # another group
        ([{"apiGroups": ["*"], "resources": ["pods", "pods/log"], "verbs": ["get", "create"]}], [PODS[1]]),
        # Rules for named objects only grant no create or list.
        ([{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["*"], "resourceNames": ["a"]}], PODS),
        ([], PODS),
    ],
)
def test_missing_permissions(granted: list[dict[str, Any]], missing: list[Permission]) -> None:
    assert missing_permissions(granted, PODS) == missing


def test_the_message_names_each_missing_verb_and_the_fix() -> None:
    message = render_missing(
        [Permission("", "pods", "list"), Permission("", "secrets", "delete")], "training", "docs/guides/rbac.md"
    )
    assert message.startswith(
        "the Kubernetes credentials cannot `list` `pods`, `delete` `secrets` in namespace training"
    )
    assert "add `list` on `pods`, `delete` on `secrets` to the Role bound to them; see docs/guides/rbac.md" in message
