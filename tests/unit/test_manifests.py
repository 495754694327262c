"""Rendered Kubernetes objects: structure, ownership, pod contract, and strict schema validation."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from airflow_mpi.exceptions import SpecError
from airflow_mpi.kinds.manifests import render_manifests
from tests.helpers import plan_for, spec_from

GOLDEN = Path(__file__).parent / "golden" / "manifests.yaml"

SPECS: list[tuple[str, dict[str, Any]]] = [
    ("cpu", {"workers": {"replicas": 2, "cpu": 2, "memory": "4Gi"}}),
    ("master only", {}),
    (
        "gpu full pod settings",
        {
            "master": {"cpu": 8, "memory": "64Gi", "gpus": 8, "gpu_type": "NVIDIA-H100-80GB-HBM3"},
            "workers": {"replicas": 3, "cpu": 8, "memory": "64Gi", "gpus": 8, "gpu_type": "NVIDIA-H100-80GB-HBM3"},
            "hosts_mode": "hostfile",
            "env": {"NCCL_DEBUG": "INFO"},
            "pod": {
                "namespace": "ml",
                "node_selector": {"pool": "gpu"},
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "spot", "value": "true", "effect": "NoExecute", "toleration_seconds": 60},
                ],
                "volumes": [
                    {"name": "data", "mount_path": "/data", "persistent_volume_claim": "datasets", "read_only": True},
                    {"name": "ckpt", "mount_path": "/ckpt", "host_path": "/mnt/ckpt"},
                    {"name": "cfg", "mount_path": "/cfg", "config_map": "train-cfg"},
                    {"name": "creds", "mount_path": "/creds", "secret": "s3", "sub_path": "key"},
                    {"name": "scratch", "mount_path": "/scratch", "empty_dir": True},
                ],
                "service_account": "trainer",
                "image_pull_secrets": ["regcred"],
                "image_pull_policy": "IfNotPresent",
                "priority_class": "high",
                "labels": {"team": "ml"},
                "annotations": {"example.com/owner": "ml-team"},
                "shm_size": "16Gi",
            },
        },
    ),
    (
        "gpu workers only",
        {"master": {"cpu": "500m"}, "workers": {"replicas": 2, "gpus": 4, "gpu_resource": "amd.com/gpu"}},
    ),
]


def objects_for(fields: dict[str, Any]) -> list[dict[str, Any]]:
    spec = spec_from(**fields)
    return render_manifests(
        plan_for(spec), spec.pod.namespace or "default", owner_uid="1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    )


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
@pytest.mark.parametrize(("case", "fields"), SPECS, ids=[s[0] for s in SPECS])
def test_every_object_passes_strict_schema(case: str, fields: dict[str, Any], version: str) -> None:
    for obj in objects_for(fields):
        kubernetes_validate.validate(obj, version, strict=True)


def test_objects_and_order() -> None:
    objects = objects_for(SPECS[0][1])
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    job = objects[0]["metadata"]["name"]
    assert kinds == [
        ("Service", job),
        ("Secret", f"{job}-ssh"),
        ("ConfigMap", f"{job}-config"),
        ("Pod", f"{job}-worker-0"),
        ("Pod", f"{job}-worker-1"),
        ("Pod", f"{job}-master-0"),
    ]
    for obj in objects[1:]:
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "name": job,
                "uid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
                "controller": True,
            }
        ]
        assert obj["metadata"]["labels"]["airflow-mpi.io/job"] == job


def test_headless_service_resolves_before_ready() -> None:
    service = objects_for(SPECS[0][1])[0]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_pod_contract() -> None:
    objects = objects_for(SPECS[2][1])
    job = objects[0]["metadata"]["name"]
    pods = [o for o in objects if o["kind"] == "Pod"]
    for pod in pods:
        spec = pod["spec"]
        container = spec["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert spec["hostname"] == pod["metadata"]["name"] and spec["subdomain"] == job
        assert spec["restartPolicy"] == "Never"
        assert container["command"] == ["bash", "/etc/mpi/launch.sh"]
        assert env["GJ_TRAINING_POD_NAME"] == pod["metadata"]["name"]
        assert env["MPI_HOST"] == ",".join(f"{job}-worker-{i}.{job}" for i in range(3))
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert container["resources"]["requests"] == container["resources"]["limits"]
        assert spec["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        ssh_volume = next(v for v in spec["volumes"] if v["name"] == "mpi-ssh")
        host_keys = [i for i in ssh_volume["secret"]["items"] if i["key"].startswith("host-")]
        assert host_keys == [{"key": f"host-{pod['metadata']['name']}", "path": "ssh_host_ed25519_key"}]
        assert ssh_volume["secret"]["defaultMode"] == 0o400
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert spec["activeDeadlineSeconds"] == 300 + 86400 + 60
    workers = [p for p in pods if "worker" in p["metadata"]["name"]]
    assert all(w["spec"]["containers"][0]["readinessProbe"]["tcpSocket"]["port"] == 22 for w in workers)
    master = pods[-1]
    assert "readinessProbe" not in master["spec"]["containers"][0]


LEAVE_SOON = [
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 20},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 20},
]


@pytest.mark.parametrize(
    ("tolerations", "added"),
    [
        ([], LEAVE_SOON),
        ([{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}], LEAVE_SOON),
        ([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
           "toleration_seconds": 120}], LEAVE_SOON[1:]),
        ([{"key": "node.kubernetes.io/not-ready", "operator": "Equal"}], LEAVE_SOON[:1]),
        ([{"key": "node.kubernetes.io/not-ready", "value": "x", "effect": "NoExecute"}], LEAVE_SOON),
        ([{"operator": "Exists"}], []),
    ],
    ids=["none", "another taint", "unreachable for 120 s", "not-ready, any effect", "a value never set", "every taint"],
)  # fmt: skip
def test_every_pod_leaves_a_lost_node_in_seconds_unless_the_job_says_otherwise(
    tolerations: list[dict[str, Any]], added: list[dict[str, Any]]
) -> None:
    """Kubernetes keeps a pod 300 s on a Node that stopped reporting (20 s here): a job cannot go
    on without it, and the eviction is the only mark a pod never Ready there gets. A job's own
    toleration of either taint is kept as it wrote it."""
    for obj in objects_for({"workers": {"replicas": 1}, "pod": {"tolerations": tolerations}}):
        if obj["kind"] == "Pod":
            own = obj["spec"]["tolerations"][: len(tolerations)]
            assert [t.get("key") for t in own] == [t.get("key") for t in tolerations]
            assert obj["spec"]["tolerations"][len(tolerations) :] == added


def test_secret_holds_keys_and_render_can_redact() -> None:
    spec = spec_from(workers={"replicas": 1})
    plan = plan_for(spec)
    secret = render_manifests(plan, "default")[1]
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["id_ed25519"] == "CLIENT-PRIVATE-KEY\n"
    assert set(data) >= {"authorized_keys", "known_hosts", "ssh_config", "sshd_config", f"host-{plan.master.name}"}
    redacted = render_manifests(plan, "default", redact_secrets=True)[1]
    assert "PRIVATE" not in yaml.safe_dump(redacted)


def test_image_is_required_on_kubernetes() -> None:
    spec = spec_from(image="")
    with pytest.raises(SpecError) as caught:
        render_manifests(plan_for(spec), "default")
    assert caught.value.fields == ("image",)


def test_golden_manifests() -> None:
    """The rendered objects of the CPU example, byte for byte (UPDATE_GOLDEN=1 rewrites it)."""
    import os

    text = yaml.safe_dump_all(objects_for(SPECS[0][1]), sort_keys=True)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
