"""The API double's gang controllers fire as the real ones do: custom objects are checked against
their CRD, Volcano's policies keep ended pods and delete running ones, deleting a Volcano Job takes
everything it owns, and a held or full cluster keeps a group waiting with the reason on its pods."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_mpi.kinds.volcano import render_volcano_manifests
from tests.doubles.crd_schema import crd_dir
from tests.doubles.gang_controllers import GangControllers
from tests.doubles.kube_double import KubeDouble, PodScript, ScriptedKubelet
from tests.helpers import plan_for, spec_from
from tests.k8s.conftest import Scripts, api_client_for
from tests.k8s.test_gang import _crd_validator

JOBS = "jobs.batch.volcano.sh"


@pytest.fixture
def cluster(scripts: Scripts) -> Iterator[tuple[KubeDouble, GangControllers]]:
    kube = KubeDouble(ScriptedKubelet(scripts))
    controllers = GangControllers(kube, gpus_per_node=[4])
    kube.custom_validator = _crd_validator
    kube.start()
    yield kube, controllers
    controllers.stop()
    kube.stop()


def until(check: Callable[[], Any], timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def volcano_job(workers: int = 2, gpus: int = 1) -> dict[str, Any]:
    spec = spec_from(master={"gpus": gpus}, workers={"replicas": workers, "gpus": gpus})
    return render_volcano_manifests(plan_for(spec), "default")[0]


def phase(kube: KubeDouble, name: str) -> str:
    job = kube.get(JOBS, "default", name) or {}
    return str(job.get("status", {}).get("state", {}).get("phase", ""))


def pod_phases(kube: KubeDouble) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"].get("phase", "") for p in kube.list_objects("pods", "default")}


def test_a_custom_object_that_breaks_its_crd_is_refused_with_422(cluster: tuple[KubeDouble, GangControllers]) -> None:
    if crd_dir() is None:
        pytest.skip("no CRDs beside the checkout")
    kube, _ = cluster
    body = volcano_job()
    body["spec"]["tasks"][0]["replicas"] = "one"
    api = client.CustomObjectsApi(api_client_for(kube))
    with pytest.raises(ApiException) as caught:
        api.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", body)
    assert caught.value.status == 422 and "replicas" in str(caught.value.body)


def test_complete_job_keeps_the_succeeded_master_and_deletes_running_workers(
    cluster: tuple[KubeDouble, GangControllers], scripts: Scripts
) -> None:
    kube, _ = cluster
    body = volcano_job(workers=2)
    name = body["metadata"]["name"]
    kube.create(JOBS, "default", copy.deepcopy(body))
    until(lambda: phase(kube, name) == "Completed")
    until(lambda: pod_phases(kube) == {f"{name}-master-0": "Succeeded"})
    service = kube.get("services", "default", name)
    assert service is not None and service["spec"]["selector"] == {
        "volcano.sh/job-name": name,
        "volcano.sh/job-namespace": "default",
    }
    hosts = kube.get("configmaps", "default", f"{name}-svc")
    assert hosts is not None and hosts["data"]["VC_WORKER_HOSTS"] == f"{name}-worker-0.{name},{name}-worker-1.{name}"
    kube.delete(JOBS, "default", name)
    until(lambda: not kube.list_objects("pods", "default") and not kube.list_objects("services", "default"))
    assert kube.list_objects("configmaps", "default") == []
    assert kube.list_objects("podgroups.scheduling.volcano.sh", "default") == []


def test_a_failed_worker_terminates_the_job_and_is_kept(
    cluster: tuple[KubeDouble, GangControllers], scripts: Scripts
) -> None:
    kube, _ = cluster
    scripts.on("-worker-0", PodScript(fail_after=0.2, fail_exit_code=2))
    scripts.on("-master-", PodScript(lines=lambda: iter(["training"])))  # until deleted
    body = volcano_job(workers=2)
    name = body["metadata"]["name"]
    kube.create(JOBS, "default", copy.deepcopy(body))
    until(lambda: phase(kube, name) == "Terminated")
    until(lambda: pod_phases(kube) == {f"{name}-worker-0": "Failed"})


def test_a_job_that_does_not_fit_waits_with_no_pods_and_its_group_pending(
    cluster: tuple[KubeDouble, GangControllers],
) -> None:
    kube, controllers = cluster
    body = volcano_job(workers=2, gpus=2)  # 6 GPUs on a node of 4
    name = body["metadata"]["name"]
    kube.create(JOBS, "default", copy.deepcopy(body))
    until(lambda: phase(kube, name) == "Pending")
    time.sleep(0.5)
    assert kube.list_objects("pods", "default") == [] and controllers.admissions == []


def test_a_held_pod_group_marks_its_pods_and_starts_them_together(
    cluster: tuple[KubeDouble, GangControllers],
) -> None:
    from airflow_mpi.kinds.gang import render_gang_manifests

    kube, controllers = cluster
    controllers.hold_admission(1.0)
    plan = plan_for(spec_from(workers={"replicas": 1}, scheduling={"gang": "coscheduling"}))
    objects = render_gang_manifests(plan, "default")
    for obj in objects:
        obj["metadata"].pop("ownerReferences", None)
        plural = "podgroups.scheduling.x-k8s.io" if obj["kind"] == "PodGroup" else obj["kind"].lower() + "s"
        kube.create("configmaps" if obj["kind"] == "ConfigMap" else plural, "default", obj)
    waiting = until(
        lambda: [
            c["message"]
            for p in kube.list_objects("pods", "default")
            for c in p["status"].get("conditions", [])
            if c.get("reason") == "Unschedulable"
        ]
    )
    assert f"pod group {plan.job_name} is Pending" in waiting[0]
    group = kube.get("podgroups.scheduling.x-k8s.io", "default", plan.job_name)
    assert group is not None and group["status"]["phase"] == "Pending"
    until(lambda: "Pending" not in pod_phases(kube).values())  # both started once admitted
    assert controllers.admissions and controllers.admissions[0][1] == plan.job_name
