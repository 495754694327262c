"""Builders shared by the tests: specs, fixed ssh material, run identities."""

from __future__ import annotations

from typing import Any

from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.job.ssh import KeyPair, SshMaterial
from airflow_mpi.job.topology import build_topology
from airflow_mpi.spec import MPIJobSpec

IDENTITY = RunIdentity("dag", "train", "manual__2026-01-01T00:00:00+00:00")


def spec_from(**fields: Any) -> MPIJobSpec:
    data: dict[str, Any] = {"name": "job", "image": "registry.example/train:1", "command": ["python", "/app/train.py"]}
    data.update(fields)
    return MPIJobSpec.from_dict(data)


def fixed_ssh(spec: MPIJobSpec, identity: RunIdentity = IDENTITY) -> SshMaterial:
    """Deterministic keys, so rendered files can be compared with golden text."""
    from airflow_mpi.job.naming import build_job_name

    pods = build_topology(spec, build_job_name(spec.name, identity)).pods
    return SshMaterial(
        client=KeyPair("CLIENT-PRIVATE-KEY\n", "ssh-ed25519 AAAAclient airflow-mpi@job"),
        host_keys={pod: KeyPair(f"HOST-PRIVATE-KEY-{pod}\n", f"ssh-ed25519 AAAA{pod} root@{pod}") for pod in pods},
    )


def plan_for(spec: MPIJobSpec, identity: RunIdentity = IDENTITY) -> JobPlan:
    return render_plan(spec, identity, ssh=fixed_ssh(spec, identity))
