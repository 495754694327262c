"""A cluster's NCCL_IB_* from its ``mpi`` connection (``nccl_ib_env``): written into every pod of
every kind, checked before anything is created, and still refused in a job spec's ``env``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_mpi.exceptions import BackendUnavailable, SpecError
from airflow_mpi.hooks.mpi import MPIJobHook
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.spec import MPIJobSpec

SPEC = {"name": "ib", "image": "registry.example/train:1", "command": ["python", "t.py"], "workers": {"replicas": 2}}
NCCL = {"NCCL_IB_HCA": "mlx5", "NCCL_IB_GID_INDEX": "3"}


def connect(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> MPIJobHook:
    extra = {"backend": "kubernetes", "namespace": "training", **extra}
    monkeypatch.setenv("AIRFLOW_CONN_MPI_IB", json.dumps({"conn_type": "mpi", "extra": extra}))
    return MPIJobHook("mpi_ib")


def containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for obj in objects:
        for template in _pod_specs(obj):
            found += template.get("containers", [])
    return found


def _pod_specs(obj: Any) -> list[dict[str, Any]]:
    if isinstance(obj, dict):
        own = [obj] if "containers" in obj else []
        return own + [spec for value in obj.values() for spec in _pod_specs(value)]
    if isinstance(obj, list):
        return [spec for value in obj for spec in _pod_specs(value)]
    return []


@pytest.mark.parametrize("backend", ["kubernetes", "volcano", "mpijob"])
def test_every_container_of_every_kind_gets_the_clusters_nccl_ib_variables(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    kube = connect(monkeypatch, backend=backend, nccl_ib_env=NCCL).get_backend()
    plan = kube.render_plan(MPIJobSpec.from_dict(SPEC), RunIdentity("d", "t", "r"))  # type: ignore[attr-defined]
    found = containers(kube.kind.render(plan, "training"))  # type: ignore[attr-defined]
    assert found, backend
    for container in found:
        env = {item["name"]: item.get("value") for item in container.get("env", [])}
        assert {name: env.get(name) for name in NCCL} == NCCL, (backend, container["name"])
    # A rank on a worker gets only what mpiexec exports (sshd starts it without the pod's env).
    exports = [plan.mpiexec_argv[i + 1] for i, arg in enumerate(plan.mpiexec_argv) if arg == "-x"]
    assert set(NCCL) <= set(exports), exports
    assert all(f"  {name}\n" in plan.config_files["mpiexec.args"] for name in NCCL)


def test_a_connection_without_them_writes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = connect(monkeypatch).get_backend()
    plan = kube.render_plan(MPIJobSpec.from_dict(SPEC), RunIdentity("d", "t", "r"))  # type: ignore[attr-defined]
    assert not any(name.startswith("NCCL_IB_") for pod in plan.pods for name in pod.env)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"NCCL_SOCKET_IFNAME": "eth0"}, "names 'NCCL_SOCKET_IFNAME'; it holds NCCL_IB_* variables only"),
        ({"NCCL_IB_HCA": 5}, "gives NCCL_IB_HCA the value 5; give strings"),
        (["NCCL_IB_HCA"], "give an object of NCCL_IB_* names"),
        ("not json", "give an object of NCCL_IB_* names"),
    ],
)
def test_a_wrong_value_names_the_extra_and_the_fix(monkeypatch: pytest.MonkeyPatch, value: Any, says: str) -> None:
    with pytest.raises(BackendUnavailable, match="extra 'nccl_ib_env'") as caught:
        connect(monkeypatch, nccl_ib_env=value).get_backend()
    assert says in str(caught.value)


def test_a_job_spec_still_may_not_set_them() -> None:
    with pytest.raises(SpecError, match="NCCL_IB_HCA"):
        MPIJobSpec.from_dict({**SPEC, "env": {"NCCL_IB_HCA": "mlx5"}})
