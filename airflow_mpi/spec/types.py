"""The MPI job spec's types: frozen dataclasses, loadable from a dict (YAML/JSON).

Field names are the same in Python, YAML and JSON. ``MPIJobSpec.from_dict`` reports every
problem at once (unknown keys, wrong types, and the pod contract's rules, docs/contract.md),
each naming the field and the fix: parsing is ``parsing``'s, the rules are ``validation``'s.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from airflow_mpi.contract import HostsMode
from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.spec.parsing import parse_dataclass, to_plain
from airflow_mpi.spec.quantities import parse_cpu
from airflow_mpi.spec.scheduling import SchedulingSpec
from airflow_mpi.spec.validation import collect_spec_issues


@dataclass(frozen=True)
class RoleSpec:
    """Resources of one role. ``cpu`` is cores (``2``, ``0.5`` or ``"500m"``); slots come from it
    when neither role has GPUs, otherwise from ``gpus`` (docs/contract.md#host-and-np)."""

    replicas: int = 1
    cpu: int | float | str = 1
    memory: str | None = None
    gpus: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    gpu_type: str | None = None  # GPU model, e.g. "NVIDIA-A100-SXM4-80GB" (node label)

    @property
    def cpu_cores(self) -> Decimal:
        """CPU as a number of cores; ``Decimal(0)`` when the value is not a quantity."""
        return parse_cpu(self.cpu) or Decimal(0)


@dataclass(frozen=True)
class MasterSpec(RoleSpec):
    """The master (launcher) role: exactly one pod; runs mpiexec and, with slots, ranks too."""

    replicas: int = 1


@dataclass(frozen=True)
class WorkerSpec(RoleSpec):
    """The worker role: 0..N pods that only run sshd (and the ranks mpiexec starts there)."""

    replicas: int = 0


@dataclass(frozen=True)
class MPIOptions:
    """Typed mpiexec options; the defaults map one rank per slot, bind nothing and tag output by
    rank. ``timeout`` comes from the job's ``timeout``; host list, ``-np`` and
    ``--allow-run-as-root`` are the launch script's (docs/contract.md#mpiexec-options)."""

    np: int | None = None  # default: every slot; set to run fewer ranks
    npernode: int | None = None
    oversubscribe: bool = False
    pml: str | None = None  # e.g. "ob1"
    btl: str | None = None  # e.g. "tcp,self" or "^openib"
    btl_tcp_if_include: str | None = None
    btl_tcp_if_exclude: str | None = None
    oob_tcp_if_include: str | None = None
    oob_tcp_if_exclude: str | None = None
    bind_to: str = "none"
    map_by: str = "slot"
    report_bindings: bool = False
    export_env: tuple[str, ...] = ("PATH", "LD_LIBRARY_PATH")  # -x VAR or -x VAR=value
    env_file: str | None = None
    verbose: bool = False
    debug: bool = False
    help_aggregate: bool = True  # false -> --mca orte_base_help_aggregate 0
    display_map: bool = False
    no_tree_spawn: bool = True
    leave_session_attached: bool = False
    quiet: bool = False
    tag_output: bool = True
    wdir: str | None = None
    mca: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    master_port: int = 29500  # MASTER_PORT for torch.distributed / DeepSpeed


@dataclass(frozen=True)
class Toleration:
    key: str | None = None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


@dataclass(frozen=True)
class Volume:
    """A volume mounted into every pod; exactly one source. The local backend supports
    ``host_path`` and ``empty_dir``."""

    name: str
    mount_path: str
    read_only: bool = False
    sub_path: str | None = None
    host_path: str | None = None
    persistent_volume_claim: str | None = None
    config_map: str | None = None
    secret: str | None = None
    empty_dir: bool = False

    @property
    def sources(self) -> tuple[str, ...]:
        named = {
            "host_path": self.host_path,
            "persistent_volume_claim": self.persistent_volume_claim,
            "config_map": self.config_map,
            "secret": self.secret,
        }
        chosen = [key for key, value in named.items() if value]
        return (*chosen, "empty_dir") if self.empty_dir else tuple(chosen)


@dataclass(frozen=True)
class PodSettings:
    """What a Kubernetes user sets on the pods for GPU training. Applies to every pod."""

    namespace: str | None = None  # default: the connection's namespace
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    volumes: tuple[Volume, ...] = ()
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    image_pull_policy: str | None = None
    priority_class: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    shm_size: str | None = None  # size of a memory-backed /dev/shm, e.g. "2Gi" (NCCL, DataLoader)
    # Jobs without root (docs/contract.md#jobs-without-root): sshd and every rank run as this uid,
    # with the securityContext the Pod Security Standards' "restricted" profile asks for.
    run_as_user: int | None = None  # None: the image's user (root)
    run_as_group: int | None = None  # default: the same number as run_as_user

    @property
    def run_as(self) -> tuple[int, int] | None:
        """``(uid, gid)`` every pod's processes run as, or ``None``: the image's user (root)."""
        if self.run_as_user is None:
            return None
        group = self.run_as_group if self.run_as_group is not None else self.run_as_user
        return self.run_as_user, group


@dataclass(frozen=True)
class MPIJobSpec:
    """One MPI training job: one master plus ``workers.replicas`` workers."""

    name: str
    command: tuple[str, ...]
    image: str = ""
    master: MasterSpec = field(default_factory=MasterSpec)
    workers: WorkerSpec = field(default_factory=WorkerSpec)
    env: Mapping[str, str] = field(default_factory=dict)
    mpi: MPIOptions = field(default_factory=MPIOptions)
    hosts_mode: HostsMode = HostsMode.HOST
    timeout: int = 86400
    startup_timeout: int = 300
    ssh_port: int = 22
    pod: PodSettings = field(default_factory=PodSettings)
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    # Small text files shipped in the job's config directory (/etc/mpi, the ConfigMap): e.g. the
    # source and arguments of a @task.mpi function (docs/contract.md#pod-paths).
    files: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Accept lists where tuples are declared, so Python callers can write plain literals.
        if isinstance(self.command, list):
            object.__setattr__(self, "command", tuple(self.command))
        if isinstance(self.hosts_mode, str) and not isinstance(self.hosts_mode, HostsMode):
            try:
                object.__setattr__(self, "hosts_mode", HostsMode(self.hosts_mode))
            except ValueError:
                pass  # reported by validated()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MPIJobSpec:
        """Parse and validate; raises ``SpecError`` listing every problem."""
        issues: list[SpecIssue] = []
        spec = parse_dataclass(cls, data, "", issues)
        if spec is not None:
            issues.extend(collect_spec_issues(spec, skip=frozenset(i.field for i in issues)))
        if issues or spec is None:
            raise SpecError(
                issues or [SpecIssue("<spec>", "could not be parsed", "give a mapping of the spec's fields")]
            )
        return spec

    def to_dict(self) -> dict[str, Any]:
        """Plain data with the same field names ``from_dict`` reads (for YAML, JSON, templating)."""
        return typing.cast(dict[str, Any], to_plain(self))

    def validated(self) -> MPIJobSpec:
        """Return self after checking every rule; raises ``SpecError`` listing every problem.

        The fields' types are checked too, through the same parser as ``from_dict``: a spec built
        in Python (``MPIJobSpec(name=3, command="train.py")``) gets the same messages as YAML."""
        MPIJobSpec.from_dict(self.to_dict())
        return self
