"""A controller kind's objects are owned from the start: the top object first, then our Secret and
ConfigMap created with it as their owner (no window in which a private key is owned by nothing),
a TrainJob's runtime (no key in it) before it; a create that fails after the Secret deletes it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.backends.creation import JobCreation
from airflow_mpi.exceptions import LaunchError
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.kinds.registry import job_kind
from airflow_mpi.spec import MPIJobSpec

Obj = dict[str, Any]
UID = "0b0e5d7c-top"


class Api:
    """Core and custom objects in one store, recording each call in order; ``fail_on`` makes the
    create of that plural fail (after what came before it was made)."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.store: dict[tuple[str, str], Obj] = {}
        self.fail_on = fail_on

    def _create(self, plural: str, manifest: Obj) -> Obj:
        name = manifest["metadata"]["name"]
        self.calls.append(("create", plural, name))
        if plural == self.fail_on:
            raise LaunchError(f"creating {plural} {name} failed")
        stored = {**manifest, "metadata": {**manifest["metadata"], "uid": UID, "resourceVersion": "7"}}
        self.store[(plural, name)] = stored
        return stored

    # CoreObjects
    def create(self, namespace: str, plural: Any, manifest: Obj) -> Obj:
        return self._create(plural if isinstance(plural, str) else plural[2], manifest)

    def replace(self, namespace: str, plural: Any, manifest: Obj) -> None:
        plural = plural if isinstance(plural, str) else plural[2]
        self.calls.append(("replace", plural, manifest["metadata"]["name"]))
        self.store[(plural, manifest["metadata"]["name"])] = manifest

    def delete(self, namespace: str, plural: Any, name: str, **_: Any) -> None:
        plural = plural if isinstance(plural, str) else plural[2]
        self.calls.append(("delete", plural, name))
        self.store.pop((plural, name), None)

    def get(self, namespace: str, resource: Any, name: str) -> Obj | None:
        return None


def creation_for(kind: str, api: Api) -> tuple[JobCreation, Any]:
    spec = MPIJobSpec.from_dict({"name": "own", "image": "registry.example/t:1", "command": ["true"]})
    plan = job_kind(kind).render_plan(spec, RunIdentity("d", "t", "r"))

    def watch(plan: Any, namespace: str, version: str) -> Any:
        return SimpleNamespace(roles={})

    def remove(job_name: str, namespace: str) -> None:  # the top object: the collector takes the rest
        api.delete(namespace, job_kind(kind).top_resource, job_name)

    return JobCreation(api, api, job_kind(kind), 4, watch, remove), plan  # type: ignore[arg-type]


TOPS = {"mpijob": "mpijobs", "trainjob": "trainjobs"}


@pytest.mark.parametrize("kind", ["mpijob", "trainjob"])
def test_the_secret_and_config_map_are_created_owned_by_the_top_object(kind: str) -> None:
    api = Api()
    maker, plan = creation_for(kind, api)
    maker.create(plan, "ml")
    creates = [(plural, name) for verb, plural, name in api.calls if verb == "create"]
    top_at = creates.index((TOPS[kind], plan.job_name))
    for plural in ("secrets", "configmaps"):
        (at,) = [i for i, (p, _) in enumerate(creates) if p == plural]
        assert at > top_at, creates  # never before anything owns it
    secrets = [obj for (plural, _), obj in api.store.items() if plural == "secrets"]
    assert [ref["uid"] for ref in secrets[0]["metadata"]["ownerReferences"]] == [UID]
    # Nothing of ours is updated afterwards but a TrainJob's runtime (it holds no key).
    assert {plural for verb, plural, _ in api.calls if verb == "replace"} <= {"trainingruntimes"}
    if kind == "trainjob":
        assert creates.index(("trainingruntimes", plan.job_name)) < top_at  # Trainer reads it at once


@pytest.mark.parametrize("kind", ["mpijob", "trainjob"])
def test_a_create_that_fails_after_the_secret_leaves_no_secret(kind: str) -> None:
    api = Api(fail_on="configmaps")
    maker, plan = creation_for(kind, api)
    with pytest.raises(LaunchError, match="creating configmaps"):
        maker.create(plan, "ml")
    assert ("create", "secrets") in [(verb, plural) for verb, plural, _ in api.calls]
    assert api.store == {}, api.store  # the Secret, the top object (and a runtime) deleted
