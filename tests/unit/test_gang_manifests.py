"""Gang scheduling for the Kubernetes backend's pods: the PodGroup, each pod's marks, the master
created together with the workers, and the scheduling section's rules."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from airflow_mpi.exceptions import SpecError
from airflow_mpi.kinds.gang import (
    COSCHEDULING_GROUP_LABEL,
    KUEUE_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_RETRIABLE_ANNOTATION,
    KUEUE_TOTAL_ANNOTATION,
    VOLCANO_GROUP_ANNOTATION,
    render_gang_manifests,
    sum_requests,
)
from airflow_mpi.kinds.manifests import render_manifests
from airflow_mpi.spec import Gang, parse_quantity, render_quantity
from tests.crds import assert_valid_custom_object
from tests.helpers import plan_for, spec_from

GPU = {"cpu": 8, "memory": "64Gi", "gpus": 8}


def _objects(scheduling: dict[str, Any], **fields: Any) -> tuple[Any, list[dict[str, Any]]]:
    plan = plan_for(spec_from(scheduling=scheduling, **fields))
    return plan, render_gang_manifests(plan, "ml", owner_uid="svc-uid")


def _pods(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "Pod"]


@pytest.mark.parametrize("gang", ["volcano", "coscheduling", "kueue"])
def test_master_is_created_with_the_workers_not_after_them(gang: str) -> None:
    plan, objects = _objects({"gang": gang, "queue": "q"} if gang != "coscheduling" else {"gang": gang})
    kinds = [o["kind"] for o in objects]
    assert kinds[:3] == ["Service", "Secret", "ConfigMap"]
    names = [o["metadata"]["name"] for o in _pods(objects)]
    assert names == [pod.name for pod in plan.pods]  # master first: the group is whole at once
    if gang == "kueue":
        assert "PodGroup" not in kinds  # Kueue builds its Workload from the pods
    else:
        assert kinds.index("PodGroup") < kinds.index("Pod")


def test_volcano_pod_group_and_pod_marks() -> None:
    plan, objects = _objects({"gang": "volcano", "queue": "training"}, workers={"replicas": 3, **GPU}, master=GPU)
    group = next(o for o in objects if o["kind"] == "PodGroup")
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["metadata"]["name"] == plan.job_name
    assert group["metadata"]["ownerReferences"][0]["uid"] == "svc-uid"
    assert group["spec"] == {
        "minMember": 4,
        "minResources": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "32"},
        "queue": "training",
    }
    for pod in _pods(objects):
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATION] == plan.job_name
    assert_valid_custom_object(group)


def test_volcano_pod_group_carries_the_priority_class() -> None:
    _, objects = _objects({"gang": "volcano"}, pod={"priority_class": "high"})
    group = next(o for o in objects if o["kind"] == "PodGroup")
    assert group["spec"]["priorityClassName"] == "high" and "queue" not in group["spec"]
    assert_valid_custom_object(group)


def test_coscheduling_pod_group_and_label() -> None:
    plan, objects = _objects({"gang": "coscheduling"}, workers={"replicas": 1, "cpu": 2})
    group = next(o for o in objects if o["kind"] == "PodGroup")
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 2, "minResources": {"cpu": "3"}}
    for pod in _pods(objects):
        assert pod["metadata"]["labels"][COSCHEDULING_GROUP_LABEL] == plan.job_name
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_kueue_labels_and_annotations_on_every_pod() -> None:
    plan, objects = _objects({"gang": "kueue", "queue": "training"}, workers={"replicas": 2})
    for pod in _pods(objects):
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels[KUEUE_QUEUE_LABEL] == "training"
        assert labels[KUEUE_GROUP_LABEL] == plan.job_name
        assert annotations[KUEUE_TOTAL_ANNOTATION] == "3"
        assert annotations[KUEUE_RETRIABLE_ANNOTATION] == "false"
        assert "schedulerName" not in pod["spec"]  # Kueue admits; the default scheduler binds


def test_scheduler_name_overrides_the_default() -> None:
    _, objects = _objects({"gang": "coscheduling", "scheduler_name": "gang-scheduler"})
    assert {p["spec"]["schedulerName"] for p in _pods(objects)} == {"gang-scheduler"}


@pytest.mark.parametrize("gang", ["volcano", "coscheduling", "kueue"])
def test_gang_pods_pass_the_apiservers_schema(gang: str) -> None:
    scheduling = {"gang": gang, "queue": "q"} if gang != "coscheduling" else {"gang": gang}
    _, objects = _objects(scheduling, workers={"replicas": 2})
    for obj in objects:
        if obj["apiVersion"] == "v1":
            kubernetes_validate.validate(obj, "1.33", strict=True)


def test_without_gang_the_objects_are_todays() -> None:
    plan = plan_for(spec_from(workers={"replicas": 2}))
    assert render_gang_manifests(plan, "ml", owner_uid="u") == render_manifests(plan, "ml", owner_uid="u")
    named = plan_for(spec_from(workers={"replicas": 1}, scheduling={"scheduler_name": "custom"}))
    pods = _pods(render_gang_manifests(named, "ml"))
    assert [p["spec"]["schedulerName"] for p in pods] == ["custom", "custom"]


def test_sum_of_requests_adds_mixed_units() -> None:
    plan = plan_for(spec_from(master={"cpu": 1, "memory": "512Mi"}, workers={"replicas": 2, "cpu": 2, "memory": "1Gi"}))
    assert sum_requests(plan) == {"cpu": "5", "memory": "2560Mi"}
    assert parse_quantity("1500m") is not None and render_quantity(parse_quantity("1500m")) == "1500m"
    assert render_quantity(parse_quantity("2G")) == "2G"


@pytest.mark.parametrize(
    ("scheduling", "field", "fix"),
    [
        ({"gang": "kueue"}, "scheduling.queue", "LocalQueue"),
        ({"gang": "coscheduling", "queue": "q"}, "scheduling.queue", "remove it"),
        ({"gang": "slurm"}, "scheduling.gang", "'volcano'"),
        ({"queue": "Bad_Queue"}, "scheduling.queue", "lowercase"),
        ({"queue_timeout": 0}, "scheduling.queue_timeout", "no bound"),
        ({"gang": "volcano", "queu": "q"}, "scheduling.queu", "did you mean 'queue'"),
    ],
)
def test_scheduling_rules_name_the_field_and_the_fix(scheduling: dict[str, Any], field: str, fix: str) -> None:
    with pytest.raises(SpecError) as raised:
        spec_from(scheduling=scheduling)
    issue = next(i for i in raised.value.issues if i.field == field)
    assert fix in f"{issue.problem} {issue.fix}"


def test_scheduling_round_trips_through_plain_data() -> None:
    spec = spec_from(scheduling={"gang": "volcano", "queue": "training", "queue_timeout": 600})
    assert spec.scheduling.gang is Gang.VOLCANO
    assert type(spec).from_dict(spec.to_dict()) == spec
