"""Hosts, slots and the platform environment: the four host/NP cases, in Python.

The rules are docs/contract.md#host-and-np; the slot counts themselves are ``spec.slots``.

The launch script computes the same thing in bash from the environment rendered here; the tests
run both and compare, so the two never drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from airflow_mpi import contract
from airflow_mpi.contract import Role
from airflow_mpi.job.naming import build_host_name, build_pod_name
from airflow_mpi.spec import MPIJobSpec, SlotPlan, build_slot_plan, parse_cpu


@dataclass(frozen=True)
class HostSlots:
    host: str  # <pod>.<job>
    pod: str
    slots: int


@dataclass(frozen=True)
class Topology:
    """Names and slots of one job: what mpiexec gets as hosts and -np."""

    job_name: str
    master_pod: str
    worker_pods: tuple[str, ...]
    rank_hosts: tuple[HostSlots, ...]  # in mpiexec order: master first (if it holds ranks)
    np: int  # ranks mpiexec starts (``mpi.np`` or every slot)
    slot_plan: SlotPlan

    @property
    def master_host(self) -> str:
        return build_host_name(self.job_name, self.master_pod)

    @property
    def worker_hosts(self) -> tuple[str, ...]:
        return tuple(build_host_name(self.job_name, pod) for pod in self.worker_pods)

    @property
    def pods(self) -> tuple[str, ...]:
        return (self.master_pod, *self.worker_pods)

    @property
    def remote_hosts(self) -> tuple[str, ...]:
        """Hosts mpiexec reaches over ssh (every rank host but the master's own pod)."""
        return tuple(h.host for h in self.rank_hosts if h.pod != self.master_pod)

    @property
    def rank0_host(self) -> str:
        """Where rank 0 runs: MASTER_ADDR for torch.distributed (not the master if it has no rank)."""
        return self.rank_hosts[0].host if self.rank_hosts else self.master_host


def build_topology(
    spec: MPIJobSpec,
    job_name: str,
    master_pod: str | None = None,
    worker_pod: Callable[[int], str] | None = None,
) -> Topology:
    """``master_pod``: the master's own name where a controller names it (mpi-operator's
    ``<job>-launcher``); default ``<job>-master-0``. ``worker_pod``: worker ``i``'s name where a
    controller names the workers (JobSet's ``<job>-worker-0-<i>``); default ``<job>-worker-<i>``."""
    slot_plan = build_slot_plan(spec)
    master_pod = master_pod or build_pod_name(job_name, Role.MASTER, 0)
    name_worker = worker_pod or (lambda index: build_pod_name(job_name, Role.WORKER, index))
    worker_pods = tuple(name_worker(i) for i in range(max(spec.workers.replicas, 0)))
    rank_hosts: list[HostSlots] = []
    if slot_plan.master_slots:
        rank_hosts.append(HostSlots(build_host_name(job_name, master_pod), master_pod, slot_plan.master_slots))
    if slot_plan.worker_slots:
        rank_hosts += [HostSlots(build_host_name(job_name, p), p, slot_plan.worker_slots) for p in worker_pods]
    np = spec.mpi.np if spec.mpi.np is not None else slot_plan.np
    return Topology(job_name, master_pod, worker_pods, tuple(rank_hosts), np, slot_plan)


def render_mpi_host(topology: Topology) -> str:
    """``MPI_HOST`` as the platform writes it: every worker host, comma-separated."""
    return ",".join(topology.worker_hosts)


def render_mpi_hosts(topology: Topology) -> str:
    """``MPI_HOSTS`` as the launch script computes it: ``host:slots`` items, comma-separated."""
    return ",".join(f"{h.host}:{h.slots}" for h in topology.rank_hosts)


def render_hostfile(topology: Topology) -> str:
    """``/etc/mpi/hostfile``: one ``<host> slots=N`` line per host that runs ranks
    (docs/contract.md#hostfile-mode)."""
    return "".join(f"{h.host} slots={h.slots}\n" for h in topology.rank_hosts)


def render_cpu_env(cpu: object) -> str:
    cores = parse_cpu(cpu)
    if cores is None:
        return str(cpu)
    return str(int(cores)) if cores == cores.to_integral_value() else format(cores.normalize(), "f")


def build_platform_env(spec: MPIJobSpec, topology: Topology, role: Role, pod_name: str) -> dict[str, str]:
    """The variables the platform writes into every pod, plus the launch script's own
    (docs/contract.md#platform-variables)."""
    return {**build_job_env(spec, topology), **build_role_env(role, pod_name)}


def build_job_env(spec: MPIJobSpec, topology: Topology) -> dict[str, str]:
    """The part of the platform env that is the same in every pod (``MPI_HOST`` lists every
    worker: built once and shared, not once per pod)."""
    env = {
        contract.ENV_JOB_NAME: topology.job_name,
        contract.ENV_MASTER_CPU: render_cpu_env(spec.master.cpu),
        contract.ENV_MASTER_GPU: str(spec.master.gpus),
        contract.ENV_MASTER_REPLICAS: str(spec.master.replicas),
        contract.ENV_WORKER_CPU: render_cpu_env(spec.workers.cpu),
        contract.ENV_WORKER_GPU: str(spec.workers.gpus),
        contract.ENV_WORKER_REPLICAS: str(spec.workers.replicas),
        contract.ENV_MPI_HOST: render_mpi_host(topology),
        contract.ENV_HOSTS_MODE: spec.hosts_mode.value,
        contract.ENV_SSH_PORT: str(spec.ssh_port),
        contract.ENV_STARTUP_TIMEOUT: str(spec.startup_timeout + contract.STARTUP_GRACE_SECONDS),
    }
    if spec.mpi.np is not None:
        env[contract.ENV_NP_OVERRIDE] = str(spec.mpi.np)
    return env


def build_role_env(role: Role, pod_name: str) -> dict[str, str]:
    return {contract.ENV_ROLE: role.value, contract.ENV_POD_NAME: pod_name}


def build_pod_env(
    spec: MPIJobSpec, topology: Topology, role: Role, pod_name: str, job_env: dict[str, str] | None = None
) -> dict[str, str]:
    """Platform env first (role, job, pod, then the rest), then the user's (which may not override it)."""
    shared = job_env if job_env is not None else build_job_env(spec, topology)
    role_env = build_role_env(role, pod_name)
    ordered = {
        contract.ENV_ROLE: role_env[contract.ENV_ROLE],
        contract.ENV_JOB_NAME: shared[contract.ENV_JOB_NAME],
        contract.ENV_POD_NAME: role_env[contract.ENV_POD_NAME],
    }
    return {**ordered, **shared, **spec.env}
