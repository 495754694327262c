"""Each component's own Role, against the double: the worker's check before it creates anything
and the triggerer's before it follows a deferred job each refuse a Role without one of their
verbs, naming the verb, the resource and the service account (a SelfSubjectReview's answer)."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import LaunchError
from airflow_mpi.triggers.mpi import MPIJobTrigger
from tests.documented import documented_role_rules
from tests.doubles.kube_double import KubeDouble
from tests.k8s.conftest import api_client_for, install_connections, job_objects
from tests.k8s.test_kubernetes_backend import make_plan


def without(rules: list[dict[str, Any]], resource: str, verb: str) -> list[dict[str, Any]]:
    """The rules with ``verb`` on ``resource`` taken away (and nothing else)."""
    out = []
    for rule in copy.deepcopy(rules):
        if resource in rule["resources"] and verb in rule["verbs"]:
            rest = [r for r in rule["resources"] if r != resource]
            if rest:
                out.append({**rule, "resources": rest})
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                out.append({**rule, "resources": [resource], "verbs": verbs})
        else:
            out.append(rule)
    return out


def verbs_of(component: str) -> list[tuple[str, str]]:
    rules = documented_role_rules(component)
    return [(resource, verb) for rule in rules for resource in rule["resources"] for verb in rule["verbs"]]


@pytest.mark.parametrize(("resource", "verb"), verbs_of("worker"), ids=[f"{r}-{v}" for r, v in verbs_of("worker")])
def test_the_worker_refuses_a_role_without_each_verb_naming_it_and_who(
    double: KubeDouble, resource: str, verb: str
) -> None:
    double.grant(without(documented_role_rules("worker"), resource, verb))
    backend = KubernetesBackend(api_client=api_client_for(double), namespace="default")
    with pytest.raises(LaunchError) as caught:
        backend.create(make_plan(workers=1))
    assert str(caught.value).startswith(
        f"the service account airflow/airflow-worker cannot `{verb}` `{resource}` in namespace default "
        "(checked before anything was created;"
    ), caught.value
    assert f"add `{verb}` on `{resource}` to the worker's Role bound to it" in str(caught.value)
    assert job_objects(double) == []


def test_a_job_refused_by_the_check_is_torn_down_without_a_request(double: KubeDouble) -> None:
    """Nothing was created, so its teardown asks for nothing (a DELETE the Role may not allow would
    only add a misleading "teardown left" line to the task's log) and nothing is left."""
    double.grant(without(documented_role_rules("worker"), "pods", "create"))
    backend = KubernetesBackend(api_client=api_client_for(double), namespace="default")
    plan = make_plan(workers=1)
    with pytest.raises(LaunchError):
        backend.create(plan)
    before = len(double.requests)
    backend.teardown(plan.job_name)
    assert backend.leftovers(plan.job_name) == []
    assert double.requests[before:] == []
    assert job_objects(double) == []


def test_the_worker_role_is_enough_for_the_check(double: KubeDouble) -> None:
    double.grant(documented_role_rules("worker"))
    backend = KubernetesBackend(api_client=api_client_for(double), namespace="default")
    backend.check_permissions("default", make_plan(workers=1).spec)  # raises, naming a verb it lacks


def fire(trigger: MPIJobTrigger) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    return asyncio.run(first())


def trigger_for(plan: Any, **changes: Any) -> MPIJobTrigger:
    contract: dict[str, Any] = {
        "job_name": plan.job_name,
        "namespace": "default",
        "kubernetes_conn_id": "kube_double",
        "deadline": time.time() + 20,
        "worker_pods": [w.name for w in plan.workers],
        "master_pod": plan.master.name,
        "timeout": 20.0,
        "api_timeout": 10.0,
        **changes,
    }
    return MPIJobTrigger(contract=contract)


@pytest.mark.parametrize(
    ("resource", "verb"), verbs_of("triggerer"), ids=[f"{r}-{v}" for r, v in verbs_of("triggerer")]
)
def test_the_trigger_refuses_a_triggerer_role_without_each_verb_naming_it_and_who(
    double: KubeDouble, monkeypatch: pytest.MonkeyPatch, resource: str, verb: str
) -> None:
    install_connections(monkeypatch, double)
    double.grant(without(documented_role_rules("triggerer"), resource, verb))
    started = time.monotonic()
    event = fire(trigger_for(make_plan(workers=1)))
    assert event["outcome"] == "api_refused", event
    assert event["reason"].startswith(
        f"the service account airflow/airflow-worker cannot `{verb}` `{resource}` in namespace default "
        "(checked before the trigger followed the job;"
    ), event
    assert f"add `{verb}` on `{resource}` to the triggerer's Role bound to it" in event["reason"]
    assert time.monotonic() - started < 5  # at once, not at the deadline


def test_the_trigger_checks_what_its_kill_deletes(double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose kill deletes an MPIJob: the triggerer's Role must allow that delete too."""
    install_connections(monkeypatch, double)
    double.grant(documented_role_rules("triggerer"))
    mpijob = ["kubeflow.org", "v2beta1", "mpijobs"]
    event = fire(trigger_for(make_plan(workers=1), kind="mpijob", custom_objects=[mpijob]))
    assert event["outcome"] == "api_refused", event
    assert "cannot `get` `mpijobs`, `delete` `mpijobs` in namespace default (" in event["reason"], event


def test_a_triggerer_role_that_is_enough_goes_on_to_watch(double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    install_connections(monkeypatch, double)
    double.grant(documented_role_rules("triggerer"))
    # No pod of the job exists: the watch, not the check, decides (the job is gone).
    plan = make_plan(workers=1)
    event = fire(trigger_for(plan))
    assert event["reason"].startswith(f"no pod of MPI job {plan.job_name} is left in namespace default"), event
