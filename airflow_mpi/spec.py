"""The MPI job spec: frozen, typed, loadable from a dict (YAML/JSON), validated in full before I/O.

Field names are the same in Python, YAML and JSON. ``MPIJobSpec.from_dict`` reports every
problem at once (unknown keys, wrong types, and the semantic rules of seeds 000 and 002), each
naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any, TypeVar, Union

from airflow_mpi.contract import DEFAULT_PATHS, RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES
from airflow_mpi.exceptions import SpecError, SpecIssue


class HostsMode(str, Enum):
    """How mpiexec learns the hosts: seed 000's ``--host`` list, or seed 002's hostfile."""

    HOST = "host"
    HOSTFILE = "hostfile"


class Role(str, Enum):
    MASTER = "master"
    WORKER = "worker"


@dataclass(frozen=True)
class RoleSpec:
    """Resources of one role. ``cpu`` is cores (``2``, ``0.5`` or ``"500m"``); slots come from it
    when neither role has GPUs, otherwise from ``gpus`` (seed 000)."""

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
    """mpiexec options (seed 002), defaulting to its production advice. ``timeout`` comes from the
    job's ``timeout``; host list, ``-np`` and ``--allow-run-as-root`` are the launch script's."""

    np: int | None = None  # default: every slot (seed 000); set to run fewer ranks
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
        spec = _parse_dataclass(cls, data, "", issues)
        if spec is not None:
            issues.extend(collect_spec_issues(spec, skip=frozenset(i.field for i in issues)))
        if issues or spec is None:
            raise SpecError(issues or [SpecIssue("<spec>", "could not be parsed")])
        return spec

    def to_dict(self) -> dict[str, Any]:
        """Plain data with the same field names ``from_dict`` reads (for YAML, JSON, templating)."""
        return typing.cast(dict[str, Any], _to_plain(self))

    def validated(self) -> MPIJobSpec:
        """Return self after checking every rule; raises ``SpecError`` listing every problem."""
        issues = collect_spec_issues(self)
        if issues:
            raise SpecError(issues)
        return self


# --------------------------------------------------------------------------------------------
# Quantities and names
# --------------------------------------------------------------------------------------------

# Anchored with \Z, not $ (which also matches before a final newline): the apiserver allows none.
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]+)?\Z")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")  # DNS-1035: Service names start with a letter
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_MCA_NAME = re.compile(r"^[a-z][a-z0-9_]*\Z")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_CPU_MILLI = Decimal("0.001")

# The job name gets "-<8 hex>" so two runs never collide (naming.build_job_name).
JOB_HASH_LEN = 8
MAX_DNS_LABEL = 63
MAX_DNS_SUBDOMAIN = 253
# Past startup and the job timeout, kubelet ends the pods itself, even with no Airflow around:
# activeDeadlineSeconds = startup_timeout + timeout + this grace, and Kubernetes keeps it in an int32.
DEADLINE_GRACE_SECONDS = 60
MAX_POD_DEADLINE_SECONDS = 2**31 - 1
# Kubernetes allows 256 KiB of annotations (keys and values) per object; the run identity's take
# up to 3 x 250 characters, kept free here.
MAX_ANNOTATION_BYTES = 256 * 1024 - 4096

LAUNCHERS = {
    "deepspeed": "DeepSpeed's launcher",
    "torchrun": "torchrun",
    "horovodrun": "horovodrun",
    "mpirun": "mpirun",
    "mpiexec": "mpiexec",
    "accelerate": "accelerate's launcher",
}
LAUNCHER_MODULES = ("deepspeed.launcher", "torch.distributed.run", "torch.distributed.launch")
SCRIPT_INTERPRETERS = {".sh": "bash", ".bash": "bash", ".py": "python", ".pl": "perl"}
BIND_TO = {"none", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board"}
MAP_BY = {"slot", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board", "node"}
PULL_POLICIES = {"Always", "IfNotPresent", "Never"}
TOLERATION_OPERATORS = {"Equal", "Exists"}
TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}

# MCA parameters the product sets itself: changing them breaks host names, ssh or abort.
OWNED_MCA = {
    "orte_abort_on_non_zero_status": "a rank that exits non-zero must end the job (with 0, mpiexec "
    "returned 0 although a rank exited 3)",
    "plm_rsh_agent": "the launch uses the job's ssh configuration",
    "plm_rsh_args": "the launch uses the job's ssh configuration",
    "orte_keep_fqdn_hostnames": "pod host names are <pod>.<job> and must stay fully qualified",
}
# Flags the launch script sets, or that the typed options already express.
OWNED_FLAGS = {
    "--host": "hosts_mode",
    "-H": "hosts_mode",
    "-host": "hosts_mode",
    "--hostfile": "hosts_mode",
    "-hostfile": "hosts_mode",
    "--machinefile": "hosts_mode",
    "-machinefile": "hosts_mode",
    "-np": "mpi.np",
    "--np": "mpi.np",
    "-n": "mpi.np",
    "-c": "mpi.np",
    "--allow-run-as-root": "(always set)",
    "--timeout": "timeout",
    "-timeout": "timeout",
}


def parse_cpu(value: object) -> Decimal | None:
    """Cores from ``2``, ``0.5``, ``"2"`` or ``"500m"``; ``None`` if it is not a CPU quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            cores = Decimal(str(value))
        except InvalidOperation:
            return None
        return cores if cores.is_finite() else None
    if isinstance(value, str) and _QUANTITY.match(value):
        if value.endswith("m"):
            return Decimal(value[:-1]) / 1000
        if value[-1].isdigit() or "." in value:
            try:
                return Decimal(value)
            except InvalidOperation:
                return None
    return None


def render_cpu(cores: Decimal) -> str:
    """Kubernetes quantity for a number of cores: ``2`` or ``500m``."""
    if cores == cores.to_integral_value():
        return str(int(cores))
    return f"{int((cores * 1000).to_integral_value())}m"


def is_dns_label(text: str) -> bool:
    return len(text) <= MAX_DNS_LABEL and bool(_DNS_LABEL.match(text))


def max_name_length(worker_replicas: int) -> int:
    """Longest ``name`` whose longest pod name (``<name>-<hash>-worker-<N-1>``) is a DNS label."""
    suffix = max(len("-master-0"), len("-worker-") + len(str(max(worker_replicas - 1, 0))))
    return MAX_DNS_LABEL - (1 + JOB_HASH_LEN) - suffix


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def collect_spec_issues(spec: MPIJobSpec, skip: frozenset[str] = frozenset()) -> list[SpecIssue]:
    """Every semantic problem of a well-typed spec. ``skip``: fields already reported as mistyped."""
    checks = (
        _check_name,
        _check_command,
        _check_roles,
        _check_slots,
        _check_env,
        _check_mpi,
        _check_job_settings,
        _check_pod,
    )
    issues: list[SpecIssue] = []
    for check in checks:
        for issue in check(spec):
            if not any(issue.field == s or issue.field.startswith(s + ".") for s in skip):
                issues.append(issue)
    return issues


def _check_name(spec: MPIJobSpec) -> list[SpecIssue]:
    name = spec.name
    if not isinstance(name, str) or not name:
        return [SpecIssue("name", "is empty", "give the job a short name such as 'train-digits'")]
    issues = []
    if not _DNS_LABEL.match(name):
        issues.append(
            SpecIssue(
                "name",
                f"{name!r} cannot become a DNS-1123 label (pod and host names are built from it)",
                "use lowercase letters, digits and '-', starting with a letter and ending with a letter or digit",
            )
        )
    limit = max_name_length(max(spec.workers.replicas, 0) if isinstance(spec.workers.replicas, int) else 0)
    if len(name) > limit:
        longest = f"{name}-{'h' * JOB_HASH_LEN}-worker-{max(spec.workers.replicas - 1, 0)}"
        issues.append(
            SpecIssue(
                "name",
                f"{name!r} is {len(name)} characters: the longest pod host name would be {len(longest)} > 63",
                f"use at most {limit} characters (63 minus the run hash and the '-worker-N' suffix)",
            )
        )
    return issues


def _check_command(spec: MPIJobSpec) -> list[SpecIssue]:
    command = spec.command
    if not command:
        return [SpecIssue("command", "is empty", "give the entry as an argv list, e.g. ['python', '/app/train.py']")]
    issues = []
    for index, arg in enumerate(command):
        if not isinstance(arg, str):
            issues.append(SpecIssue(f"command[{index}]", f"{arg!r} is not a string", "quote it"))
        elif "\0" in arg:
            issues.append(SpecIssue(f"command[{index}]", "contains a NUL byte", "remove it"))
    if issues:
        return issues
    program = command[0].rsplit("/", 1)[-1]
    if program in LAUNCHERS:
        issues.append(
            SpecIssue(
                "command",
                f"starts with {LAUNCHERS[program]} ({command[0]!r}); mpiexec already starts one process per "
                "slot, a second launcher clashes ranks (seed 002 FAQ)",
                "run the script itself, e.g. ['python', 'train.py', ...]: under MPI DeepSpeed is a library only",
            )
        )
    if _is_python(program) and len(command) > 2 and command[1] == "-m":
        module = command[2]
        if any(module == m or module.startswith(m + ".") for m in LAUNCHER_MODULES):
            issues.append(
                SpecIssue(
                    "command",
                    f"runs the launcher module {module!r} under mpiexec (two launchers clash ranks)",
                    "run the training script directly: ['python', 'train.py', ...]",
                )
            )
    for suffix, interpreter in SCRIPT_INTERPRETERS.items():
        if program.endswith(suffix):
            issues.append(
                SpecIssue(
                    "command",
                    f"starts with the script {command[0]!r} without an interpreter; remote nodes may not run "
                    "it (seed 002 FAQ)",
                    f"say [{interpreter!r}, {command[0]!r}, ...]",
                )
            )
    return issues


def _is_python(program: str) -> bool:
    return bool(re.match(r"^python[0-9.]*$", program))


def _check_roles(spec: MPIJobSpec) -> list[SpecIssue]:
    issues = []
    if spec.master.replicas != 1:
        issues.append(
            SpecIssue(
                "master.replicas",
                f"is {spec.master.replicas}; an MPI job has exactly one master (the launcher)",
                "set master.replicas to 1 and add workers with workers.replicas",
            )
        )
    if spec.workers.replicas < 0:
        issues.append(SpecIssue("workers.replicas", f"is {spec.workers.replicas}", "use 0 or more workers"))
    for role_name, role in (("master", spec.master), ("workers", spec.workers)):
        cores = parse_cpu(role.cpu)
        if cores is None:
            issues.append(
                SpecIssue(f"{role_name}.cpu", f"{role.cpu!r} is not a CPU quantity", "use cores like 2, 0.5 or '500m'")
            )
        elif cores <= 0:
            issues.append(SpecIssue(f"{role_name}.cpu", f"is {role.cpu!r}", "give at least 1 core (or e.g. '500m')"))
        elif cores % _CPU_MILLI:
            issues.append(SpecIssue(f"{role_name}.cpu", f"{role.cpu!r} is finer than 1m", "round to whole millicores"))
        if role.memory is not None and not (isinstance(role.memory, str) and _QUANTITY.match(role.memory)):
            issues.append(
                SpecIssue(
                    f"{role_name}.memory", f"{role.memory!r} is not a memory quantity", "use e.g. '8Gi' or '512Mi'"
                )
            )
        if role.gpus < 0:
            issues.append(SpecIssue(f"{role_name}.gpus", f"is {role.gpus}", "use 0 (CPU only) or more GPUs"))
        if not _RESOURCE_NAME.match(role.gpu_resource):
            issues.append(
                SpecIssue(
                    f"{role_name}.gpu_resource",
                    f"{role.gpu_resource!r} is not an extended resource name",
                    "use e.g. 'nvidia.com/gpu' or 'amd.com/gpu'",
                )
            )
    master, workers = spec.master, spec.workers
    if master.gpus > 0 and workers.gpus > 0 and workers.replicas > 0:
        rule = "when both roles use GPUs, the GPU model and GPUs per node must be the same (seed 000)"
        if master.gpus != workers.gpus:
            issues.append(
                SpecIssue(
                    "workers.gpus",
                    f"is {workers.gpus} but master.gpus is {master.gpus}; {rule}",
                    "give both roles the same number of GPUs, or give the master 0 GPUs (it then runs no rank)",
                )
            )
        if master.gpu_resource != workers.gpu_resource:
            issues.append(
                SpecIssue(
                    "workers.gpu_resource",
                    f"is {workers.gpu_resource!r} but master.gpu_resource is {master.gpu_resource!r}; {rule}",
                    "use the same GPU resource on both roles",
                )
            )
        if master.gpu_type != workers.gpu_type:
            issues.append(
                SpecIssue(
                    "workers.gpu_type",
                    f"is {workers.gpu_type!r} but master.gpu_type is {master.gpu_type!r}; {rule}",
                    "use the same GPU model on both roles",
                )
            )
    return issues


def _check_slots(spec: MPIJobSpec) -> list[SpecIssue]:
    # Imported here: topology imports this module's types.
    from airflow_mpi.topology import build_slot_plan

    if spec.master.replicas != 1 or spec.workers.replicas < 0 or spec.master.gpus < 0 or spec.workers.gpus < 0:
        return []  # reported by _check_roles
    slot_plan = build_slot_plan(spec)
    issues = []
    for role_name, role in (("master", spec.master), ("workers", spec.workers)):
        if slot_plan.slots_from_cpu and (role_name == "master" or spec.workers.replicas > 0):
            cores = parse_cpu(role.cpu)
            if cores is not None and cores > 0 and cores != cores.to_integral_value():
                issues.append(
                    SpecIssue(
                        f"{role_name}.cpu",
                        f"{role.cpu!r} cores cannot be MPI slots; with no GPUs on either role the slots are the "
                        "CPU cores (seed 000)",
                        "use a whole number of cores",
                    )
                )
    if spec.master.gpus > 0 and spec.workers.gpus == 0 and spec.workers.replicas > 0:
        issues.append(
            SpecIssue(
                "workers.gpus",
                f"is 0 while master.gpus is {spec.master.gpus}: the {spec.workers.replicas} worker(s) would get no "
                "rank (seed 000: with GPUs on the master only, only the master runs ranks)",
                f"give workers {spec.master.gpus} GPUs like the master, or set workers.replicas to 0",
            )
        )
    if slot_plan.np <= 0:
        issues.append(
            SpecIssue(
                "workers.replicas",
                f"the resources give MPI_NP={slot_plan.np}: {slot_plan.case_text}",
                "add workers (workers.replicas >= 1), or give the master GPUs or CPU slots",
            )
        )
    mpi = spec.mpi
    if mpi.np is not None and mpi.np > slot_plan.np > 0 and not mpi.oversubscribe:
        issues.append(
            SpecIssue(
                "mpi.np",
                f"is {mpi.np} but the hosts have {slot_plan.np} slots",
                f"use at most {slot_plan.np}, add workers, or set mpi.oversubscribe (debugging only)",
            )
        )
    if mpi.npernode is not None and mpi.npernode >= 1 and slot_plan.np > 0:
        capacity = mpi.npernode * slot_plan.rank_nodes
        wanted = mpi.np if mpi.np is not None else slot_plan.np
        if wanted > capacity:
            issues.append(
                SpecIssue(
                    "mpi.npernode",
                    f"{mpi.npernode} per node on {slot_plan.rank_nodes} node(s) holds {capacity} ranks, "
                    f"but {wanted} are asked",
                    f"raise mpi.npernode to {-(-wanted // slot_plan.rank_nodes)} or set mpi.np to {capacity}",
                )
            )
    return issues


def _check_env(spec: MPIJobSpec) -> list[SpecIssue]:
    issues = []
    for name, value in spec.env.items():
        path = f"env.{name}"
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            issues.append(
                SpecIssue(path, f"{name!r} is not an environment variable name", "use [A-Za-z_][A-Za-z0-9_]*")
            )
            continue
        if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
            issues.append(
                SpecIssue(
                    path,
                    "is written by the platform or computed by the launch script; users must not set it "
                    "(GJ_TRAINING_*, MPI_HOST, MPI_NP, MPI_HOSTS, NCCL_IB_*, AIRFLOW_MPI_*)",
                    "remove it from env; size the job with master/workers and hosts_mode instead",
                )
            )
        mca = name[len("OMPI_MCA_") :] if name.startswith("OMPI_MCA_") else ""
        if mca in OWNED_MCA:
            issues.append(SpecIssue(path, f"would change the owned MCA parameter {mca}: {OWNED_MCA[mca]}", "remove it"))
        if not isinstance(value, str):
            issues.append(SpecIssue(path, f"value {value!r} is not a string", "quote it"))
        elif "\0" in value:
            issues.append(SpecIssue(path, "contains a NUL byte", "remove it"))
    return issues


def _check_mpi(spec: MPIJobSpec) -> list[SpecIssue]:
    mpi = spec.mpi
    issues = []
    if mpi.np is not None and mpi.np < 1:
        issues.append(SpecIssue("mpi.np", f"is {mpi.np}", "use at least 1, or leave it out to use every slot"))
    if mpi.npernode is not None and mpi.npernode < 1:
        issues.append(SpecIssue("mpi.npernode", f"is {mpi.npernode}", "use at least 1, or leave it out"))
    if mpi.bind_to not in BIND_TO:
        issues.append(
            SpecIssue("mpi.bind_to", f"{mpi.bind_to!r} is not an Open MPI binding", f"use one of {sorted(BIND_TO)}")
        )
    map_target = mpi.map_by.split(":", 1)[0].lower()
    if map_target not in MAP_BY and not map_target.startswith("ppr"):
        issues.append(
            SpecIssue("mpi.map_by", f"{mpi.map_by!r} is not an Open MPI mapping", "use 'slot' (seed advice) or 'node'")
        )
    for key in ("pml", "btl", "btl_tcp_if_include", "btl_tcp_if_exclude", "oob_tcp_if_include", "oob_tcp_if_exclude"):
        value = getattr(mpi, key)
        if value is not None and (not value or re.search(r"\s", value)):
            issues.append(SpecIssue(f"mpi.{key}", f"{value!r} is empty or contains spaces", "use e.g. 'tcp,self'"))
    if mpi.btl_tcp_if_include and mpi.btl_tcp_if_exclude:
        issues.append(
            SpecIssue("mpi.btl_tcp_if_exclude", "set together with mpi.btl_tcp_if_include", "Open MPI takes only one")
        )
    if mpi.oob_tcp_if_include and mpi.oob_tcp_if_exclude:
        issues.append(
            SpecIssue("mpi.oob_tcp_if_exclude", "set together with mpi.oob_tcp_if_include", "Open MPI takes only one")
        )
    for index, item in enumerate(mpi.export_env):
        name = item.split("=", 1)[0]
        if not _ENV_NAME.match(name):
            issues.append(
                SpecIssue(f"mpi.export_env[{index}]", f"{item!r} is not VAR or VAR=value", "use e.g. 'NCCL_DEBUG=INFO'")
            )
        elif name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
            issues.append(SpecIssue(f"mpi.export_env[{index}]", f"{name} is owned by the platform", "remove it"))
        elif "\0" in item:
            issues.append(SpecIssue(f"mpi.export_env[{index}]", "contains a NUL byte", "remove it"))
    for key in ("env_file", "wdir"):
        value = getattr(mpi, key)
        if value is not None and not value.startswith("/"):
            issues.append(SpecIssue(f"mpi.{key}", f"{value!r} is not an absolute path", "use a path inside the pod"))
    for name, value in mpi.mca.items():
        path = f"mpi.mca.{name}"
        if not _MCA_NAME.match(name):
            issues.append(SpecIssue(path, "is not an MCA parameter name", "use e.g. btl_tcp_if_include"))
        elif name in OWNED_MCA:
            issues.append(SpecIssue(path, f"is set by airflow-mpi: {OWNED_MCA[name]}", "remove it"))
        if not isinstance(value, str) or not value or "\0" in value:
            issues.append(SpecIssue(path, f"value {value!r} must be a non-empty string", "quote it"))
    for index, arg in enumerate(mpi.extra_args):
        path = f"mpi.extra_args[{index}]"
        if "\0" in arg:
            issues.append(SpecIssue(path, "contains a NUL byte", "remove it"))
            continue
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            owner = OWNED_FLAGS[flag]
            if owner == "hosts_mode":
                problem = (
                    f"{flag!r}: the launch script already passes the hosts ({spec.hosts_mode.value} mode); "
                    "--host and a hostfile must never both be given (seed 002)"
                )
                fix = "remove it and choose hosts_mode: host (GJ --host list) or hostfile (/etc/mpi/hostfile)"
            else:
                problem = f"{flag!r} is set by airflow-mpi"
                fix = f"use {owner} instead" if owner.startswith(("mpi.", "timeout")) else "remove it"
            issues.append(SpecIssue(path, problem, fix))
    if not 1 <= mpi.master_port <= 65535:
        issues.append(SpecIssue("mpi.master_port", f"is {mpi.master_port}", "use a TCP port 1-65535 (default 29500)"))
    if mpi.master_port == spec.ssh_port:
        issues.append(SpecIssue("mpi.master_port", "is the sshd port", "use another port (default 29500)"))
    return issues


def _check_job_settings(spec: MPIJobSpec) -> list[SpecIssue]:
    issues = []
    if spec.timeout < 1:
        issues.append(SpecIssue("timeout", f"is {spec.timeout}", "give the job's limit in seconds, e.g. 3600"))
    if spec.startup_timeout < 1:
        issues.append(
            SpecIssue(
                "startup_timeout", f"is {spec.startup_timeout}", "give seconds for pods and sshd to start, e.g. 300"
            )
        )
    deadline = spec.startup_timeout + spec.timeout + DEADLINE_GRACE_SECONDS
    if spec.timeout >= 1 and spec.startup_timeout >= 1 and deadline > MAX_POD_DEADLINE_SECONDS:
        issues.append(
            SpecIssue(
                "timeout",
                f"is {spec.timeout}: with startup_timeout the pods' deadline would be {deadline} s, past the "
                f"{MAX_POD_DEADLINE_SECONDS} s Kubernetes can hold (activeDeadlineSeconds is a 32-bit integer)",
                f"use at most {MAX_POD_DEADLINE_SECONDS - DEADLINE_GRACE_SECONDS - spec.startup_timeout} seconds",
            )
        )
    if not 1 <= spec.ssh_port <= 65535:
        issues.append(SpecIssue("ssh_port", f"is {spec.ssh_port}", "use a TCP port 1-65535 (default 22)"))
    if spec.image and re.search(r"\s", spec.image):
        issues.append(SpecIssue("image", f"{spec.image!r} contains whitespace", "use an image reference"))
    if not isinstance(spec.hosts_mode, HostsMode):
        issues.append(SpecIssue("hosts_mode", f"{spec.hosts_mode!r} is not a hosts mode", "use 'host' or 'hostfile'"))
    return issues


def _check_pod(spec: MPIJobSpec) -> list[SpecIssue]:
    pod = spec.pod
    issues = []
    if pod.namespace is not None and not (len(pod.namespace) <= MAX_DNS_LABEL and _DNS1123_LABEL.match(pod.namespace)):
        issues.append(SpecIssue("pod.namespace", f"{pod.namespace!r} is not a namespace name", "use a DNS-1123 label"))
    issues += _check_label_map("pod.node_selector", pod.node_selector)
    issues += _check_label_map("pod.labels", pod.labels)
    for key in pod.annotations:
        if not _is_qualified_name(key):
            issues.append(SpecIssue(f"pod.annotations.{key}", "is not a valid annotation key", "use [prefix/]name"))
    size = sum(len(key.encode()) + len(str(value).encode()) for key, value in pod.annotations.items())
    if size > MAX_ANNOTATION_BYTES:
        issues.append(
            SpecIssue(
                "pod.annotations",
                f"hold {size} bytes; Kubernetes allows 262144 per object and the job needs 4096 of them",
                f"keep them under {MAX_ANNOTATION_BYTES} bytes (put large data in a ConfigMap)",
            )
        )
    for index, toleration in enumerate(pod.tolerations):
        path = f"pod.tolerations[{index}]"
        if toleration.operator not in TOLERATION_OPERATORS:
            issues.append(SpecIssue(f"{path}.operator", f"{toleration.operator!r}", "use 'Equal' or 'Exists'"))
        if toleration.effect is not None and toleration.effect not in TOLERATION_EFFECTS:
            issues.append(
                SpecIssue(f"{path}.effect", f"{toleration.effect!r}", f"use one of {sorted(TOLERATION_EFFECTS)}")
            )
        if toleration.operator == "Exists" and toleration.value:
            issues.append(SpecIssue(f"{path}.value", "must be empty with operator Exists", "remove it"))
        if not toleration.key and toleration.operator != "Exists":
            issues.append(
                SpecIssue(f"{path}.key", "is empty with operator Equal", "give a key, or use operator Exists")
            )
        if toleration.key and not _is_qualified_name(toleration.key):
            issues.append(
                SpecIssue(
                    f"{path}.key", f"{toleration.key!r} is not a taint key", "use [prefix/]name, name <= 63 chars"
                )
            )
        if toleration.operator == "Equal" and toleration.value and not _is_label_value(toleration.value):
            issues.append(
                SpecIssue(f"{path}.value", f"{toleration.value!r} is not a taint value", "use <= 63 of [A-Za-z0-9._-]")
            )
        if toleration.toleration_seconds is not None and toleration.effect != "NoExecute":
            issues.append(
                SpecIssue(
                    f"{path}.toleration_seconds",
                    f"is set with effect {toleration.effect!r}; it only bounds how long a NoExecute taint is tolerated",
                    "set effect: NoExecute, or remove toleration_seconds",
                )
            )
    reserved_mounts = {DEFAULT_PATHS.config_dir, DEFAULT_PATHS.ssh_secret_dir, DEFAULT_PATHS.runtime_dir}
    if pod.shm_size:
        reserved_mounts.add("/dev/shm")
    seen_names: set[str] = set()
    seen_paths: set[str] = set()
    for index, volume in enumerate(pod.volumes):
        path = f"pod.volumes[{index}]"
        if not is_dns_label(volume.name) or volume.name in {"mpi-config", "mpi-ssh", "mpi-runtime", "dshm"}:
            issues.append(
                SpecIssue(f"{path}.name", f"{volume.name!r} is not a free DNS-1123 label", "use another name")
            )
        if volume.name in seen_names:
            issues.append(SpecIssue(f"{path}.name", f"{volume.name!r} is used twice", "give each volume its own name"))
        seen_names.add(volume.name)
        if not volume.mount_path.startswith("/"):
            issues.append(SpecIssue(f"{path}.mount_path", f"{volume.mount_path!r} is not absolute", "use a pod path"))
        mount = volume.mount_path.rstrip("/") or "/"
        clash = [r for r in reserved_mounts if mount == r or r.startswith(mount + "/") or mount.startswith(r + "/")]
        if clash or mount == "/":
            issues.append(
                SpecIssue(
                    f"{path}.mount_path", f"{mount!r} overlaps {clash or ['/']} used by the job", "mount elsewhere"
                )
            )
        if mount in seen_paths:
            issues.append(SpecIssue(f"{path}.mount_path", f"{mount!r} is mounted twice", "use one volume per path"))
        seen_paths.add(mount)
        if len(volume.sources) != 1:
            issues.append(
                SpecIssue(
                    path,
                    f"has {len(volume.sources)} sources {list(volume.sources)}",
                    "give exactly one of host_path, persistent_volume_claim, config_map, secret, empty_dir",
                )
            )
        if volume.host_path is not None and not volume.host_path.startswith("/"):
            issues.append(
                SpecIssue(f"{path}.host_path", f"{volume.host_path!r} is not absolute", "use an absolute path")
            )
        if volume.host_path is not None and ".." in volume.host_path.split("/"):
            issues.append(SpecIssue(f"{path}.host_path", f"{volume.host_path!r} contains '..'", "give the path itself"))
        if volume.sub_path and (volume.sub_path.startswith("/") or ".." in volume.sub_path.split("/")):
            issues.append(
                SpecIssue(
                    f"{path}.sub_path",
                    f"{volume.sub_path!r} leaves the volume",
                    "use a relative path inside the volume, without '..'",
                )
            )
    for index, secret in enumerate(pod.image_pull_secrets):
        if not _DNS_SUBDOMAIN.match(secret):
            issues.append(SpecIssue(f"pod.image_pull_secrets[{index}]", f"{secret!r} is not a Secret name", "fix it"))
    if pod.image_pull_policy is not None and pod.image_pull_policy not in PULL_POLICIES:
        issues.append(
            SpecIssue("pod.image_pull_policy", f"{pod.image_pull_policy!r}", f"use one of {sorted(PULL_POLICIES)}")
        )
    for key in ("service_account", "priority_class"):
        value = getattr(pod, key)
        if value is not None and (len(value) > MAX_DNS_SUBDOMAIN or not _DNS_SUBDOMAIN.match(value)):
            issues.append(SpecIssue(f"pod.{key}", f"{value!r} is not a valid object name", "use a DNS-1123 name"))
    if pod.shm_size is not None and not _QUANTITY.match(pod.shm_size):
        issues.append(SpecIssue("pod.shm_size", f"{pod.shm_size!r} is not a quantity", "use e.g. '2Gi'"))
    return issues


def _is_qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_LABEL_NAME.match(name))


def _is_label_value(value: str) -> bool:
    return len(value) <= MAX_DNS_LABEL and bool(_LABEL_VALUE.match(value))


def _check_label_map(path: str, labels: Mapping[str, str]) -> list[SpecIssue]:
    issues = []
    for key, value in labels.items():
        if not _is_qualified_name(key):
            issues.append(SpecIssue(f"{path}.{key}", "is not a valid label key", "use [prefix/]name, name <= 63 chars"))
        if not isinstance(value, str) or not _is_label_value(value):
            issues.append(
                SpecIssue(f"{path}.{key}", f"value {value!r} is not a valid label value", "use <= 63 of [A-Za-z0-9._-]")
            )
    return issues


# --------------------------------------------------------------------------------------------
# Generic parsing of plain data into the frozen dataclasses above
# --------------------------------------------------------------------------------------------

T = TypeVar("T")


def _parse_dataclass(cls: type[T], data: object, path: str, issues: list[SpecIssue]) -> T | None:
    where = path or "<spec>"
    if not isinstance(data, Mapping):
        issues.append(SpecIssue(where, f"must be a mapping, got {type(data).__name__}", "use key: value pairs"))
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        field_path = f"{path}.{key}" if path else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(fields)}"
            issues.append(SpecIssue(field_path, "is not a known field", fix))
            continue
        ok, parsed = _parse_value(hints[key], value, field_path, issues)
        if ok:
            kwargs[key] = parsed
    for name, spec_field in fields.items():
        if (
            name not in data
            and spec_field.default is dataclasses.MISSING
            and spec_field.default_factory is dataclasses.MISSING
        ):
            issues.append(SpecIssue(f"{path}.{name}" if path else name, "is required", "add it"))
            return None
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:  # a required field was mistyped and dropped
        issues.append(SpecIssue(where, str(error)))
        return None


def _parse_value(hint: Any, value: object, path: str, issues: list[SpecIssue]) -> tuple[bool, Any]:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return True, None
        candidates = [a for a in args if a is not type(None)]
        for candidate in candidates:
            probe: list[SpecIssue] = []
            ok, parsed = _parse_value(candidate, value, path, probe)
            if ok and not probe:
                return True, parsed
        names = " or ".join(_type_name(a) for a in candidates)
        issues.append(SpecIssue(path, f"{value!r} is not {names}", f"give {names}"))
        return False, None
    if dataclasses.is_dataclass(hint):
        parsed = _parse_dataclass(typing.cast(type, hint), value, path, issues)
        return parsed is not None, parsed
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return True, hint(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in hint)
            issues.append(SpecIssue(path, f"{value!r} is not one of {choices}", f"use one of {choices}"))
            return False, None
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            issues.append(SpecIssue(path, f"must be a list, got {type(value).__name__}", "use a YAML/JSON list"))
            return False, None
        items = []
        all_ok = True
        for index, item in enumerate(value):
            ok, parsed = _parse_value(args[0], item, f"{path}[{index}]", issues)
            all_ok &= ok
            items.append(parsed)
        return all_ok, tuple(items)
    if origin is Mapping or hint is Mapping:
        if not isinstance(value, Mapping):
            issues.append(SpecIssue(path, f"must be a mapping, got {type(value).__name__}", "use key: value pairs"))
            return False, None
        result = {}
        all_ok = True
        for key, item in value.items():
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                issues.append(SpecIssue(f"{path}.{key}", f"{item!r} is not a string", "quote it"))
                all_ok = False
                continue
            result[str(key)] = item if isinstance(item, str) else str(item)
        return all_ok, result
    if hint is bool:
        if isinstance(value, bool):
            return True, value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
            return True, int(value)  # a templated field renders to text, e.g. "{{ params.workers }}"
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, value
    elif hint is str:
        if isinstance(value, str):
            return True, value
    else:
        raise TypeError(f"unsupported spec type {hint!r} at {path}")
    issues.append(SpecIssue(path, f"{value!r} is not {_type_name(hint)}", f"give {_type_name(hint)}"))
    return False, None


def _type_name(hint: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    if dataclasses.is_dataclass(hint):
        return "a mapping"
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "a list"
    return getattr(hint, "__name__", str(hint))


def _to_plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_to_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): _to_plain(v) for k, v in value.items()}
    return value
