"""The slot plan: how many ranks each role runs, from the role resources alone.

It is the spec's own rule (validation refuses a plan with no rank) and the base of the topology,
so it lives here, below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_mpi.spec.quantities import parse_cpu

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec


@dataclass(frozen=True)
class SlotPlan:
    """How many ranks each role runs, by the host/NP rules (names not yet known)."""

    slots_from_cpu: bool
    master_slots: int  # 0: the master runs no rank
    worker_slots: int  # per worker; 0: workers run no rank
    worker_replicas: int
    np: int  # every slot
    case_text: str

    @property
    def rank_nodes(self) -> int:
        """How many pods hold ranks."""
        return (1 if self.master_slots else 0) + (self.worker_replicas if self.worker_slots else 0)


def build_slot_plan(spec: MPIJobSpec) -> SlotPlan:
    """The four cases of docs/contract.md#host-and-np, from the role resources alone."""
    master, workers = spec.master, spec.workers
    master_gpu, worker_gpu, worker_replicas = master.gpus, workers.gpus, max(workers.replicas, 0)
    if master_gpu == 0 and worker_gpu == 0:
        master_cpu = _whole_cores(master.cpu)
        worker_cpu = _whole_cores(workers.cpu)
        plan = SlotPlan(
            True,
            master_cpu,
            worker_cpu,
            worker_replicas,
            master.replicas * master_cpu + worker_replicas * worker_cpu,
            "no GPUs on either role: slots are the CPU cores of master and workers",
        )
    elif master_gpu > 0 and worker_gpu > 0:
        plan = SlotPlan(
            False,
            master_gpu,
            worker_gpu,
            worker_replicas,
            master.replicas * master_gpu + worker_replicas * worker_gpu,
            "GPUs on both roles: slots are the GPUs of master and workers",
        )
    elif master_gpu == 0 and worker_gpu > 0:
        plan = SlotPlan(
            False,
            0,
            worker_gpu,
            worker_replicas,
            worker_replicas * worker_gpu,
            "GPUs on workers only: the master runs no rank, slots are the workers' GPUs",
        )
    else:
        plan = SlotPlan(
            False,
            master_gpu,
            0,
            worker_replicas,
            master.replicas * master_gpu,
            "GPUs on the master only: only the master runs ranks",
        )
    return plan


def _whole_cores(cpu: object) -> int:
    cores = parse_cpu(cpu)
    return int(cores) if cores is not None and cores > 0 else 0
