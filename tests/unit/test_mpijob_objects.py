"""The pure rules of the double's MPIJob controller, each as mpi-operator's source has it: its
defaults, its validation messages, the hostfile formats, condition bookkeeping, and the
apiserver's defaults for the CRD and for a batch/v1 Job."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.doubles import mpijob_objects as mo
from tests.doubles.batch_jobs import default_job
from tests.doubles.crd_schema import apply_crd_defaults, crd_dir


def job(workers: int | None = 2, **spec: Any) -> dict[str, Any]:
    replica = {"template": {"spec": {"containers": [{"name": "main", "image": "img"}]}}}
    specs: dict[str, Any] = {"Launcher": copy.deepcopy(replica)}
    if workers is not None:
        specs["Worker"] = {**copy.deepcopy(replica), "replicas": workers}
    return {
        "apiVersion": mo.API_VERSION,
        "kind": mo.KIND,
        "metadata": {"name": "pi", "namespace": "team", "uid": "u-1"},
        "spec": {"mpiReplicaSpecs": specs, **spec},
    }


def test_the_controllers_defaults_are_its_source_not_its_field_comments() -> None:
    out = mo.defaulted(job())
    spec = out["spec"]
    assert spec["runPolicy"]["cleanPodPolicy"] == "None"  # the field comment says Running
    assert (spec["slotsPerWorker"], spec["sshAuthMountPath"]) == (1, "/root/.ssh")
    assert (spec["mpiImplementation"], spec["launcherCreationPolicy"]) == ("OpenMPI", "AtStartup")
    launcher, worker = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert (launcher["restartPolicy"], launcher["replicas"]) == ("OnFailure", 1)
    assert worker["restartPolicy"] == "Never"
    assert mo.validation_errors(out) == []


def test_a_worker_spec_without_replicas_defaults_to_zero_which_validation_then_refuses() -> None:
    body = job()
    del body["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    errors = mo.validation_errors(mo.defaulted(body))
    assert errors == ["spec.mpiReplicaSpecs[Worker].replicas: Invalid value: 0: must be greater than or equal to 1"]


def test_no_worker_spec_is_valid_and_the_hostfile_is_empty() -> None:
    out = mo.defaulted(job(workers=None))
    assert mo.validation_errors(out) == [] and mo.hostfile(out) == ""


def test_validation_collects_every_error_in_gos_aggregate_form() -> None:
    body = job(slotsPerWorker=-1, mpiImplementation="LAM")
    body["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=3, restartPolicy="Always")
    body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"] = []
    errors = mo.validation_errors(mo.defaulted(body))
    assert errors == [
        'spec.mpiReplicaSpecs[Launcher].restartPolicy: Unsupported value: "Always": supported values: "Never", "OnFailure"',
        "spec.mpiReplicaSpecs[Launcher].template.spec.containers: Required value: must define at least one container",
        "spec.mpiReplicaSpecs[Launcher].replicas: Invalid value: 3: must be 1",
        "spec.slotsPerWorker: Invalid value: -1: must be greater than or equal to 0",
        'spec.mpiImplementation: Unsupported value: "LAM": supported values: "Intel", "MPICH", "OpenMPI"',
    ]
    message = mo.validation_message(errors)
    assert message.startswith(
        "Found validation errors: [spec.mpiReplicaSpecs[Launcher].restartPolicy"
    ) and message.endswith("]")
    assert mo.validation_message(errors[:1]) == f"Found validation errors: {errors[0]}"


def test_a_missing_launcher_and_a_long_name_are_refused() -> None:
    body = job(workers=100)
    del body["spec"]["mpiReplicaSpecs"]["Launcher"]
    body["metadata"]["name"] = "a" * 57  # "<name>-worker-99" is 67 characters
    errors = mo.validation_errors(mo.defaulted(body))
    assert errors[0].startswith(f'metadata.name: Invalid value: "{"a" * 57}": will not able to create pod and service')
    assert "spec.mpiReplicaSpecs[Launcher]: Required value: must have Launcher replica spec" in errors


def test_event_messages_are_truncated_at_the_event_limit() -> None:
    assert len(mo.truncate("x" * 5000)) == 1024 and mo.truncate("x" * 5000).endswith("...")
    assert mo.truncate("short") == "short"


@pytest.mark.parametrize(
    ("spec", "domain", "expected"),
    [
        ({}, "", "pi-worker-0.pi.team.svc slots=1\npi-worker-1.pi.team.svc slots=1\n"),
        (
            {"slotsPerWorker": 8},
            "cluster.local",
            "pi-worker-0.pi.team.svc.cluster.local slots=8\npi-worker-1.pi.team.svc.cluster.local slots=8\n",
        ),
        (
            {"runLauncherAsWorker": True, "slotsPerWorker": 2},
            "",
            "pi-launcher.pi.team.svc slots=2\npi-worker-0.pi.team.svc slots=2\npi-worker-1.pi.team.svc slots=2\n",
        ),
        (
            {"mpiImplementation": "MPICH", "slotsPerWorker": 4},
            "",
            "pi-worker-0.pi.team.svc:4\npi-worker-1.pi.team.svc:4\n",
        ),
    ],
)
def test_the_hostfile_lists_fqdns_with_uniform_slots(spec: dict[str, Any], domain: str, expected: str) -> None:
    assert mo.hostfile(mo.defaulted(job(**spec)), domain) == expected


def test_discover_hosts_echoes_the_running_workers_sorted() -> None:
    out = mo.defaulted(job(runLauncherAsWorker=True))
    assert mo.discover_hosts(out, ["pi-worker-1", "pi-worker-0"]) == (
        "#!/bin/sh\necho pi-launcher.pi.team.svc\necho pi-worker-0.pi.team.svc\necho pi-worker-1.pi.team.svc\n"
    )


def test_a_launcher_template_restart_policy_is_overridden_with_a_warning() -> None:
    body = job()
    body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["restartPolicy"] = "Always"
    template, warnings = mo.launcher_template(mo.defaulted(body))
    assert template["spec"]["restartPolicy"] == "OnFailure"
    assert warnings == ["Restart policy in pod template overridden by restart policy in replica spec"]


def test_runpolicy_goes_only_into_the_launcher_job() -> None:
    body = mo.defaulted(job(runPolicy={"activeDeadlineSeconds": 60, "backoffLimit": 0, "ttlSecondsAfterFinished": 5}))
    template, _ = mo.launcher_template(body)
    spec = mo.launcher_job(body, template)["spec"]
    assert (spec["activeDeadlineSeconds"], spec["backoffLimit"], spec["ttlSecondsAfterFinished"]) == (60, 0, 5)
    assert "activeDeadlineSeconds" not in mo.worker_pod(body, 0)["spec"]


def test_set_condition_changes_only_on_a_new_status_or_reason_and_finishing_turns_running_false() -> None:
    status: dict[str, Any] = {}
    assert mo.set_condition(status, "Running", "True", "MPIJobRunning", "running")
    assert not mo.set_condition(status, "Running", "True", "MPIJobRunning", "another message")
    assert mo.set_condition(status, "Failed", "True", "MPIJobEvicted", "1/2 workers are evicted")
    running = mo.condition(status, "Running")
    assert running is not None and running["status"] == "False"
    assert mo.finished(status) and [c["type"] for c in status["conditions"]] == ["Running", "Failed"]


def test_replica_status_omits_zero_counts() -> None:
    assert mo.replica_status(active=2) == {"active": 2} and mo.replica_status() == {}


def test_the_crd_defaults_are_filled_where_their_parent_exists() -> None:
    if crd_dir() is None:
        pytest.skip("no CRDs beside the checkout")
    body = job()
    body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 22}]
    apply_crd_defaults(body)
    assert body["spec"]["slotsPerWorker"] == 1 and body["spec"]["launcherCreationPolicy"] == "AtStartup"
    assert (
        body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] == "TCP"
    )
    assert "runPolicy" not in body["spec"]  # no parent, no defaults below it


def test_a_batch_job_gets_its_selector_and_pod_labels_by_uid() -> None:
    body: dict[str, Any] = {"metadata": {"name": "pi-launcher", "uid": "u-2"}, "spec": {"template": {"spec": {}}}}
    default_job(body)
    assert body["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": "u-2"}}
    assert body["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "pi-launcher"
    assert body["spec"]["backoffLimit"] == 6
