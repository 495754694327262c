"""The four host/NP cases, MPI_HOST, the hostfile and the platform env, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_mpi.job.naming import build_job_name
from airflow_mpi.job.topology import (
    build_platform_env,
    build_topology,
    render_hostfile,
    render_mpi_host,
    render_mpi_hosts,
)
from airflow_mpi.spec import Role, build_slot_plan
from tests.helpers import IDENTITY, spec_from

J = build_job_name("job", IDENTITY)
M = f"{J}-master-0.{J}"


def W(i: int) -> str:
    return f"{J}-worker-{i}.{J}"


# master, workers, expected MPI_HOSTS, expected NP
CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, int]] = [
    ("cpu-only", {"cpu": 4}, {"replicas": 2, "cpu": 8}, f"{M}:4,{W(0)}:8,{W(1)}:8", 20),
    ("cpu-only no workers", {"cpu": 3}, {"replicas": 0}, f"{M}:3", 3),
    ("gpu both", {"gpus": 2}, {"replicas": 2, "gpus": 2}, f"{M}:2,{W(0)}:2,{W(1)}:2", 6),
    ("gpu master only, no workers", {"gpus": 8}, {"replicas": 0}, f"{M}:8", 8),
    ("gpu workers only", {"cpu": 2}, {"replicas": 3, "gpus": 4}, f"{W(0)}:4,{W(1)}:4,{W(2)}:4", 12),
    (
        "gpu both, workers ignore cpu",
        {"gpus": 1, "cpu": 16},
        {"replicas": 1, "gpus": 1, "cpu": 32},
        f"{M}:1,{W(0)}:1",
        2,
    ),
    ("gpu master, zero-replica gpu workers", {"gpus": 2}, {"replicas": 0, "gpus": 2}, f"{M}:2", 2),
]


@pytest.mark.parametrize(("case", "master", "workers", "hosts", "np"), CASES, ids=[c[0] for c in CASES])
def test_host_np_cases(case: str, master: dict[str, Any], workers: dict[str, Any], hosts: str, np: int) -> None:
    spec = spec_from(master=master, workers=workers)
    topology = build_topology(spec, J)
    assert render_mpi_hosts(topology) == hosts
    assert topology.np == np == build_slot_plan(spec).np
    assert render_hostfile(topology) == "".join(
        f"{h.rsplit(':', 1)[0]} slots={h.rsplit(':', 1)[1]}\n" for h in hosts.split(",")
    )


def test_master_without_ranks_is_not_rank0_host() -> None:
    topology = build_topology(spec_from(workers={"replicas": 2, "gpus": 1}), J)
    assert topology.rank0_host == W(0)
    assert topology.remote_hosts == (W(0), W(1))


def test_np_override_keeps_hosts() -> None:
    topology = build_topology(spec_from(master={"cpu": 4}, mpi={"np": 2}), J)
    assert topology.np == 2 and render_mpi_hosts(topology) == f"{M}:4"


def test_mpi_host_lists_every_worker() -> None:
    topology = build_topology(spec_from(workers={"replicas": 3}), J)
    assert render_mpi_host(topology) == f"{W(0)},{W(1)},{W(2)}"
    assert render_mpi_host(build_topology(spec_from(), J)) == ""


def test_platform_env_golden() -> None:
    spec = spec_from(master={"cpu": "500m", "gpus": 2}, workers={"replicas": 2, "cpu": 8, "gpus": 2})
    topology = build_topology(spec, J)
    assert build_platform_env(spec, topology, Role.WORKER, f"{J}-worker-1") == {
        "GJ_TRAINING_ROLE": "worker",
        "GJ_TRAINING_VC_JOB_NAME": J,
        "GJ_TRAINING_POD_NAME": f"{J}-worker-1",
        "GJ_TRAINING_MASTER_CPU_LIMIT": "0.5",
        "GJ_TRAINING_MASTER_GPU_LIMIT": "2",
        "GJ_TRAINING_MASTER_REPLICAS": "1",
        "GJ_TRAINING_WORKER_CPU_LIMIT": "8",
        "GJ_TRAINING_WORKER_GPU_LIMIT": "2",
        "GJ_TRAINING_WORKER_REPLICAS": "2",
        "MPI_HOST": f"{W(0)},{W(1)}",
        "AIRFLOW_MPI_HOSTS_MODE": "host",
        "AIRFLOW_MPI_SSH_PORT": "22",
        "AIRFLOW_MPI_STARTUP_TIMEOUT": "310",  # startup_timeout + STARTUP_GRACE_SECONDS
    }
