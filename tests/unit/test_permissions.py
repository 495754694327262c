"""The permission checks before each component acts: which verbs a rules review lacks, and each
Role of the RBAC guide being exactly what its component checks for."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_mpi.kinds.permissions import (
    GANG_RULES,
    TRIGGER_GANG_RULES,
    TRIGGERER_RULES,
    WATCHDOG_RULES,
    WORKER_RULES,
    Permission,
    build_permissions,
    describe_user,
    missing_permissions,
    render_missing,
)
from tests.documented import documented_added_rules, documented_role_rules


def test_the_documented_roles_are_what_each_component_checks_for() -> None:
    assert sorted(build_permissions(documented_role_rules("worker"))) == sorted(build_permissions(WORKER_RULES))
    assert sorted(build_permissions(documented_role_rules("triggerer"))) == sorted(build_permissions(TRIGGERER_RULES))


def test_the_triggerer_creates_nothing_reads_no_secret_and_updates_only_leases() -> None:
    from airflow_mpi.kinds.registry import registered_kinds

    for kind in registered_kinds().values():
        for deleted in ([], kind.custom_objects_to_delete(plan_for(kind.name, "kueue"))):
            granted = kind.trigger_permissions(deleted)
            assert not [p for p in granted if p.verb == "create"], kind.name
            assert not [p for p in granted if p.resource == "secrets"], kind.name
            assert {p.resource for p in granted if p.verb == "update"} <= {"leases"}, kind.name
    # Nobody updates a ConfigMap: the launch script the pods run as root is never rewritten.
    for kind in registered_kinds().values():
        assert Permission("", "configmaps", "update") not in kind.permissions(plan_for(kind.name, None).spec)


def test_what_the_guide_says_each_backend_and_gang_adds_is_what_is_checked() -> None:
    from airflow_mpi.kinds.registry import BACKEND_OF_KIND, registered_kinds

    worker = {f"backend: {BACKEND_OF_KIND[k.name]}": k._rules for k in registered_kinds().values() if k._rules}
    worker.update({f"gang: {gang}": rules for gang, rules in GANG_RULES.items()})
    worker["progress_timeout"] = WATCHDOG_RULES
    trigger = {
        f"backend: {BACKEND_OF_KIND[k.name]}": k._trigger_rules for k in registered_kinds().values() if k._trigger_rules
    }
    trigger.update({f"gang: {gang}": rules for gang, rules in TRIGGER_GANG_RULES.items()})
    for component, expected in (("worker", worker), ("triggerer", trigger)):
        documented = documented_added_rules(component)
        assert set(documented) == set(expected), component
        for name, rules in expected.items():
            assert sorted(build_permissions(documented[name])) == sorted(build_permissions(rules)), (component, name)


def plan_for(kind: str, gang: str | None) -> Any:
    from airflow_mpi.job.naming import RunIdentity
    from airflow_mpi.kinds.registry import job_kind
    from airflow_mpi.spec import MPIJobSpec

    data: dict[str, Any] = {"name": "p", "command": ["true"]}
    if gang:
        data["scheduling"] = {"gang": gang, **({"queue": "q"} if gang == "kueue" else {})}
    return job_kind(kind).render_plan(MPIJobSpec.from_dict(data), RunIdentity("d", "t", "r"))


@pytest.mark.parametrize("kind", ["pods", "volcano", "mpijob", "trainjob"])
@pytest.mark.parametrize("gang", [None, "volcano", "coscheduling", "kueue"])
def test_the_trigger_checks_its_role_and_what_the_guide_adds_for_its_kind_and_gang(kind: str, gang: str | None) -> None:
    """What the trigger checks (its kind's reads and what a kill deletes) is within what the guide
    tells users to bind to the triggerer, and covers every verb the guide adds for the kind."""
    from airflow_mpi.kinds.registry import BACKEND_OF_KIND, job_kind

    job = job_kind(kind)
    checked = set(job.trigger_permissions(job.custom_objects_to_delete(plan_for(kind, gang))))
    added = documented_added_rules("triggerer")
    documented_kind = set(build_permissions(added.get(f"backend: {BACKEND_OF_KIND[kind]}", [])))
    documented_gang = set(build_permissions(added.get(f"gang: {gang}", []))) if gang else set()
    base = set(build_permissions(documented_role_rules("triggerer")))
    assert base | documented_kind <= checked <= base | documented_kind | documented_gang
    if kind == "pods" and gang == "kueue":  # a kill deletes the Workload Kueue made for our pods
        assert Permission("kueue.x-k8s.io", "workloads", "delete") in checked


def test_each_kind_checks_the_role_and_what_it_and_its_gang_add() -> None:
    from airflow_mpi.kinds.registry import job_kind
    from airflow_mpi.spec import MPIJobSpec

    base = set(build_permissions(WORKER_RULES))
    plain = MPIJobSpec.from_dict({"name": "p", "command": ["true"]})
    gang = MPIJobSpec.from_dict({"name": "p", "command": ["true"], "scheduling": {"gang": "coscheduling"}})
    assert set(job_kind("pods").permissions(plain)) == base
    assert set(job_kind("pods").permissions(gang)) - base == {
        Permission("scheduling.x-k8s.io", "podgroups", verb) for verb in ("create", "get", "list", "delete")
    }
    assert Permission("kubeflow.org", "mpijobs", "create") in job_kind("mpijob").permissions(plain)
    # Our Secret and ConfigMap are created owned by the MPIJob: never updated.
    assert Permission("", "secrets", "update") not in job_kind("mpijob").permissions(plain)
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
        (list(WORKER_RULES), []),
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
    assert (
        "add `list` on `pods`, `delete` on `secrets` to the worker's Role bound to them; see docs/guides/rbac.md"
        in (message)
    )


def test_the_message_names_who_lacks_the_verb_and_which_role() -> None:
    message = render_missing(
        [Permission("coordination.k8s.io", "leases", "update")],
        "training",
        "docs/guides/rbac.md",
        user="system:serviceaccount:airflow:airflow-triggerer",
        component="triggerer",
    )
    assert message.startswith(
        "the service account airflow/airflow-triggerer cannot `update` `leases` in namespace training"
    )
    assert "checked before the trigger followed the job" in message
    assert "add `update` on `leases` to the triggerer's Role bound to it" in message
    # The name a RoleBinding's subject and `kubectl auth can-i --as` take, with the group of the resource.
    assert (
        "(then `kubectl auth can-i update leases.coordination.k8s.io -n training "
        "--as system:serviceaccount:airflow:airflow-triggerer` says yes)"
    ) in message


def test_credentials_the_server_does_not_name_are_named_by_their_connection() -> None:
    message = render_missing(
        [Permission("", "pods", "create")], "training", "docs/guides/rbac.md", connection="kube_in"
    )
    assert message.startswith("the credentials of Kubernetes connection 'kube_in' cannot `create` `pods` in namespace")
    assert "kubectl auth can-i" not in message


@pytest.mark.parametrize(
    ("user", "words"),
    [
        ("system:serviceaccount:airflow:airflow-worker", "the service account airflow/airflow-worker"),
        ("alice", "the user alice"),
        (None, "the Kubernetes credentials"),
    ],
)
def test_who_the_credentials_are_in_words(user: str | None, words: str) -> None:
    assert describe_user(user) == words
    assert describe_user(user, "kube_in") == (words if user else "the credentials of Kubernetes connection 'kube_in'")
