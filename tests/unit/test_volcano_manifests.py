"""The Volcano Job backend's objects: names that match the pod contract, policies that leave
retries to Airflow, our Secret and ConfigMap under names Volcano never uses, and the CRD schema."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from airflow_mpi import contract
from airflow_mpi.exceptions import SpecError
from airflow_mpi.job.naming import LABEL_INDEX, LABEL_JOB
from airflow_mpi.kinds.manifests import share_worker_host_key
from airflow_mpi.kinds.volcano import (
    render_volcano_manifests,
    volcano_config_map_name,
    volcano_secret_name,
)
from tests.crds import assert_valid_custom_object
from tests.doubles.crd_schema import crd_dir, crd_errors
from tests.helpers import plan_for, spec_from

GPU = {"cpu": 8, "memory": "64Gi", "gpus": 8}


def _render(**fields: Any) -> tuple[Any, list[dict[str, Any]]]:
    plan = plan_for(spec_from(**fields))
    return plan, render_volcano_manifests(plan, "ml", owner_uid="uid-1")


def _tasks(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {task["name"]: task for task in job["spec"]["tasks"]}


def test_job_has_master_and_worker_tasks_and_a_gang_of_all_pods() -> None:
    plan, (job, _, _) = _render(workers={"replicas": 3, **GPU}, master=GPU)
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1" and job["kind"] == "Job"
    assert job["metadata"]["name"] == plan.job_name
    tasks = _tasks(job)
    assert list(tasks) == ["master", "worker"]
    assert tasks["master"]["replicas"] == 1 and tasks["worker"]["replicas"] == 3
    assert job["spec"]["minAvailable"] == 4
    assert job["spec"]["schedulerName"] == "volcano" and job["spec"]["queue"] == "default"
    # Volcano names pods <job>-<task>-<index>: exactly the contract's pod names.
    assert [f"{plan.job_name}-{t}-{i}" for t in tasks for i in range(tasks[t]["replicas"])] == [
        pod.name for pod in plan.pods
    ]


def test_no_worker_task_without_workers() -> None:
    _, (job, _, _) = _render()
    assert [task["name"] for task in job["spec"]["tasks"]] == ["master"]
    assert job["spec"]["minAvailable"] == 1


def test_only_svc_and_env_plugins_and_policies_leave_retries_to_airflow() -> None:
    _, (job, _, _) = _render(workers={"replicas": 2})
    assert job["spec"]["plugins"] == {"svc": [], "env": []}
    assert job["spec"]["maxRetry"] == 0
    tasks = _tasks(job)
    assert {"event": "TaskCompleted", "action": "CompleteJob"} in tasks["master"]["policies"]
    for task in tasks.values():
        assert {"events": ["PodFailed", "PodEvicted"], "action": "TerminateJob"} in task["policies"]
        assert task["template"]["spec"]["restartPolicy"] == "Never"
        assert task["maxRetry"] == 0
    assert "dependsOn" not in tasks["worker"]  # it conflicts with gang scheduling


def test_queue_scheduler_and_priority_come_from_the_spec() -> None:
    _, (job, _, _) = _render(
        scheduling={"queue": "training", "scheduler_name": "volcano-gpu"}, pod={"priority_class": "high"}
    )
    assert job["spec"]["queue"] == "training"
    assert job["spec"]["schedulerName"] == "volcano-gpu"
    assert job["spec"]["priorityClassName"] == "high"


def test_templates_take_pod_name_from_the_api_and_carry_no_per_pod_fields() -> None:
    plan, (job, _, _) = _render(workers={"replicas": 2})
    for task in job["spec"]["tasks"]:
        template = task["template"]
        assert "hostname" not in template["spec"] and "subdomain" not in template["spec"]  # the svc plugin's
        env = {item["name"]: item for item in template["spec"]["containers"][0]["env"]}
        assert env[contract.ENV_POD_NAME] == {
            "name": contract.ENV_POD_NAME,
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        }
        assert env[contract.ENV_JOB_NAME]["value"] == plan.job_name  # the Volcano job's own name
        assert template["metadata"]["labels"][LABEL_JOB] == plan.job_name
    worker = _tasks(job)["worker"]["template"]
    assert LABEL_INDEX not in worker["metadata"]["labels"]


def test_secret_and_config_map_are_renamed_and_owned_by_the_volcano_job() -> None:
    plan, (job, secret, config_map) = _render(workers={"replicas": 1})
    assert secret["metadata"]["name"] == volcano_secret_name(plan.job_name) == f"{plan.job_name}-mpi-ssh"
    assert config_map["metadata"]["name"] == volcano_config_map_name(plan.job_name)
    assert {secret["metadata"]["name"], config_map["metadata"]["name"]}.isdisjoint(
        {f"{plan.job_name}-ssh", f"{plan.job_name}-svc"}  # the ssh and svc plugins' names
    )
    for obj in (secret, config_map):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "name": plan.job_name,
            "uid": "uid-1",
            "controller": True,
        }
    volumes = {v["name"]: v for task in job["spec"]["tasks"] for v in task["template"]["spec"]["volumes"]}
    assert volumes["mpi-ssh"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert volumes["mpi-config"]["configMap"]["name"] == config_map["metadata"]["name"]


def test_workers_share_one_host_key_that_known_hosts_pins_for_each() -> None:
    plan, (job, secret, _) = _render(workers={"replicas": 3})
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    worker_keys = {data[contract.host_key_file(pod.name)] for pod in plan.workers}
    assert len(worker_keys) == 1
    assert data[contract.host_key_file(plan.master.name)] not in worker_keys
    shared = share_worker_host_key(plan)
    known = data[contract.SSH_KNOWN_HOSTS].splitlines()
    assert len(known) == 4
    public = shared.ssh.host_keys[plan.workers[0].name].public_openssh.split()[1]
    assert sum(public in line for line in known) == 3
    items = _tasks(job)["worker"]["template"]["spec"]["volumes"]
    ssh = next(v for v in items if v["name"] == "mpi-ssh")
    assert {"key": contract.host_key_file(plan.workers[0].name), "path": contract.SSH_HOST_KEY} in ssh["secret"][
        "items"
    ]


def test_a_gang_setting_for_another_scheduler_is_refused_with_the_fix() -> None:
    plan = plan_for(spec_from(scheduling={"gang": "kueue", "queue": "q"}))
    with pytest.raises(SpecError, match=r"scheduling\.gang.*use the kubernetes backend"):
        render_volcano_manifests(plan, "ml")


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"workers": {"replicas": 3, **GPU}, "master": GPU, "hosts_mode": "hostfile"},
        {
            "workers": {"replicas": 2, "cpu": 2, "memory": "512Mi"},
            "scheduling": {"queue": "training"},
            "pod": {"priority_class": "high", "tolerations": [{"key": "gpu", "operator": "Exists"}]},
        },
    ],
)
def test_every_volcano_job_passes_the_crd_schema(fields: dict[str, Any]) -> None:
    _, (job, _, _) = _render(**fields)
    assert_valid_custom_object(job)


def test_the_schema_check_catches_a_broken_job() -> None:
    if crd_dir() is None:
        pytest.skip("no CRDs beside the checkout")
    _, (job, _, _) = _render(workers={"replicas": 1})
    broken = copy.deepcopy(job)
    broken["spec"]["tasks"][0]["polices"] = []  # a typo
    broken["spec"]["minAvailable"] = -1
    errors = "\n".join(crd_errors(broken))
    assert "polices" in errors and "minAvailable" in errors
