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
from airflow_mpi.spec.parsing import check_text, parse_dataclass, to_plain
from airflow_mpi.spec.quantities import parse_cpu
from airflow_mpi.spec.scheduling import SchedulingSpec
from airflow_mpi.spec.validation import collect_spec_issues

# A map whose values Kubernetes keeps as text: numbers are refused, not converted (parsing).
TEXT_ONLY = {"text_only": True}


@dataclass(frozen=True)
class RoleSpec:
    """Resources of one role. ``cpu`` is cores (``2``, ``0.5`` or ``"500m"``); slots come from it
    when neither role has GPUs, otherwise from ``gpus`` (docs/contract.md#host-and-np)."""

    replicas: int = 1
    """Pods of this role."""
    cpu: int | float | str = 1
    """Cores per pod: ``2``, ``0.5`` or ``"500m"``. Slots are these cores when neither role has GPUs."""
    memory: str | None = None
    """Memory per pod, a Kubernetes quantity such as ``"8Gi"``."""
    gpus: int = 0
    """GPUs per pod. When a role has GPUs, slots are GPUs (the host and NP rules)."""
    gpu_resource: str = "nvidia.com/gpu"
    """The extended resource GPUs are requested as."""
    gpu_type: str | None = None
    """GPU model: the node label ``nvidia.com/gpu.product``, e.g. ``"NVIDIA-A100-SXM4-80GB"``."""

    @property
    def cpu_cores(self) -> Decimal:
        """CPU as a number of cores; ``Decimal(0)`` when the value is not a quantity."""
        return parse_cpu(self.cpu) or Decimal(0)


@dataclass(frozen=True)
class MasterSpec(RoleSpec):
    """The master (launcher) role: exactly one pod; runs mpiexec and, with slots, ranks too."""

    replicas: int = 1
    """Exactly 1: the master (launcher) runs sshd and ``mpiexec``, and ranks when it has slots."""


@dataclass(frozen=True)
class WorkerSpec(RoleSpec):
    """The worker role: 0..N pods that only run sshd (and the ranks mpiexec starts there)."""

    replicas: int = 0
    """Worker pods (0..N): each runs sshd, and the ranks ``mpiexec`` starts there."""


@dataclass(frozen=True)
class MPIOptions:
    """Typed mpiexec options; the defaults map one rank per slot, bind nothing and tag output by
    rank. ``timeout`` comes from the job's ``timeout``; host list, ``-np`` and
    ``--allow-run-as-root`` are the launch script's (docs/contract.md#mpiexec-options). Each
    option is rendered in the named implementation's own spelling
    (docs/guides/mpi-implementations.md); Open MPI's own (``mca``, ``btl``, ...) are refused for
    the others."""

    implementation: str = "openmpi"
    """The MPI the image's launcher belongs to: ``openmpi`` (4.x or 5.x, told apart at launch),
    ``mpich`` (Hydra) or ``intel`` (Intel MPI's Hydra). A launcher of another one fails the job
    at once, naming both."""
    mpiexec: str = "mpiexec"
    """The launcher the master runs: a name on its ``PATH`` or an absolute path, e.g.
    ``/usr/bin/mpiexec.mpich``."""
    np: int | None = None
    """``-np``: fewer ranks than slots. Default: every slot."""
    npernode: int | None = None
    """``--npernode N``."""
    oversubscribe: bool = False
    """``--oversubscribe`` (more ranks than slots: for debugging only)."""
    pml: str | None = None
    """``--mca pml VALUE``, e.g. ``"ob1"``."""
    btl: str | None = None
    """``--mca btl VALUE``, e.g. ``"tcp,self"`` or ``"^openib"``."""
    btl_tcp_if_include: str | None = None
    """``--mca btl_tcp_if_include VALUE``, e.g. ``"eth0"``."""
    btl_tcp_if_exclude: str | None = None
    """``--mca btl_tcp_if_exclude VALUE``."""
    oob_tcp_if_include: str | None = None
    """``--mca oob_tcp_if_include VALUE``."""
    oob_tcp_if_exclude: str | None = None
    """``--mca oob_tcp_if_exclude VALUE``."""
    bind_to: str = "none"
    """``--bind-to VALUE``."""
    map_by: str = "slot"
    """``--map-by VALUE``."""
    report_bindings: bool = False
    """``--report-bindings``."""
    export_env: tuple[str, ...] = ("PATH", "LD_LIBRARY_PATH")
    """``-x VAR`` or ``-x VAR=value`` for each; unset variables are skipped."""
    env_file: str | None = None
    """A ``VAR=VALUE`` file every rank loads before the command (Open MPI 4.1 has no ``--env-file``)."""
    verbose: bool = False
    """``-v``."""
    debug: bool = False
    """``--debug-daemons`` (Open MPI 4's ``--debug`` would start a debugger)."""
    help_aggregate: bool = True
    """``false``: ``--mca orte_base_help_aggregate 0`` (every rank's help message, not one)."""
    display_map: bool = False
    """``--display-map``."""
    no_tree_spawn: bool = True
    """``--mca plm_rsh_no_tree_spawn 1``: the master starts every daemon itself."""
    leave_session_attached: bool = False
    """``--leave-session-attached``."""
    quiet: bool = False
    """``-q``."""
    tag_output: bool = True
    """``--tag-output``: each line gets its ``[1,rank]<stdout>:`` prefix."""
    wdir: str | None = None
    """``-wdir DIR``: the ranks' working directory."""
    mca: Mapping[str, str] = field(default_factory=dict)
    """Any other ``--mca name value``. Values reach a shell on every worker: letters, digits and
    ``_ . , : / ^ = + @ % -`` only."""
    extra_args: tuple[str, ...] = ()
    """Anything else, before the command, one item per option or value, read as mpiexec reads it:
    what airflow-mpi sets (hosts, ``-np``, ``--timeout``, its MCA parameters, reserved ``-x``
    names) is refused however it is spelled."""
    master_port: int = 29500
    """``MASTER_PORT`` for ``torch.distributed`` and DeepSpeed."""


@dataclass(frozen=True)
class Toleration:
    key: str | None = None
    """The taint key the toleration matches (empty with ``operator: Exists``: every taint)."""
    operator: str = "Equal"
    """``Equal`` or ``Exists``."""
    value: str | None = None
    """The taint value (with ``Equal``)."""
    effect: str | None = None
    """``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``; empty: every effect."""
    toleration_seconds: int | None = None
    """With ``NoExecute``: how long the pod stays bound after the taint appears."""


@dataclass(frozen=True)
class Volume:
    """A volume mounted into every pod; exactly one source. The local backend supports
    ``host_path`` and ``empty_dir``."""

    name: str
    """The volume's name in the pod."""
    mount_path: str
    """Where it is mounted in every container."""
    read_only: bool = False
    """Mount it read-only."""
    sub_path: str | None = None
    """A path inside the volume to mount instead of its root."""
    host_path: str | None = None
    """A directory of the node (the local backend: of this machine)."""
    persistent_volume_claim: str | None = None
    """The name of a PersistentVolumeClaim in the job's namespace."""
    config_map: str | None = None
    """The name of a ConfigMap in the job's namespace."""
    secret: str | None = None
    """The name of a Secret in the job's namespace."""
    empty_dir: bool = False
    """A fresh empty directory per pod."""

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

    namespace: str | None = None
    """The namespace of the job's objects. Default: the connection's."""
    node_selector: Mapping[str, str] = field(default_factory=dict, metadata=TEXT_ONLY)
    """Node labels every pod must match."""
    tolerations: tuple[Toleration, ...] = ()
    """Taints every pod tolerates. Every pod also tolerates a Node that stopped reporting or is
    not ready (``node.kubernetes.io/unreachable``, ``not-ready``) for 20 s, so a lost Node ends
    the job at once; a toleration of either taint here replaces that."""
    volumes: tuple[Volume, ...] = ()
    """Volumes mounted into every pod."""
    service_account: str | None = None
    """The pods' ServiceAccount."""
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets (names) to pull the image with."""
    image_pull_policy: str | None = None
    """``Always``, ``IfNotPresent`` or ``Never``."""
    priority_class: str | None = None
    """The pods' PriorityClass (and the gang's, with ``scheduling.gang``)."""
    labels: Mapping[str, str] = field(default_factory=dict, metadata=TEXT_ONLY)
    """Extra labels on every pod."""
    annotations: Mapping[str, str] = field(default_factory=dict, metadata=TEXT_ONLY)
    """Extra annotations on every pod."""
    shm_size: str | None = None
    """Size of a memory-backed ``/dev/shm``, e.g. ``"2Gi"`` (NCCL, DataLoader workers)."""
    run_as_user: int | None = None
    """Jobs without root: sshd and every rank run as this uid, with the securityContext the Pod Security
    Standards' ``restricted`` profile asks for. Default: the image's user (root)."""
    run_as_group: int | None = None
    """The gid with ``run_as_user``. Default: the same number as ``run_as_user``."""

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
    """The job's name: a DNS label; each run's job name adds ``-<13 base32>``."""
    command: tuple[str, ...]
    """The entry as an argv list, e.g. ``[python, /app/train.py, --epochs, "8"]``: not a launcher
    (``deepspeed``, ``torchrun``, ``horovodrun``, ``mpirun``: ``mpiexec`` starts the ranks), not a
    bare script (``run.sh`` becomes ``[bash, run.sh]``)."""
    image: str = ""
    """The container image: required on Kubernetes; the local backend runs this machine's files."""
    master: MasterSpec = field(default_factory=MasterSpec)
    """The master's resources."""
    workers: WorkerSpec = field(default_factory=WorkerSpec)
    """The workers' resources."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables for every pod, exported to every rank (``-x``); the platform's own names are refused."""
    mpi: MPIOptions = field(default_factory=MPIOptions)
    """``mpiexec``'s options. Always set besides: ``--allow-run-as-root``, ``--mca
    orte_abort_on_non_zero_status 1``, ``--mca orte_keep_fqdn_hostnames 1``, ``--mca plm_rsh_args "-F
    <ssh config>"`` and ``--timeout``."""
    hosts_mode: HostsMode = HostsMode.HOST
    """``host``: ``mpiexec --host h:n,...``; ``hostfile``: ``/etc/mpi/hostfile`` with ``host slots=N``
    lines."""
    timeout: int = 86400
    """Seconds the training may run: ``mpiexec --timeout`` and a kill from the task's side."""
    startup_timeout: int = 300
    """Seconds for the pods to start and every sshd to answer (after admission, with a gang)."""
    termination_grace: int = 30
    """Seconds every rank has to save after the notice (SIGTERM) that its pod is about to go, e.g.
    when the task is killed, before it is killed. 0: no notice."""
    progress_timeout: int | None = None
    """Seconds of silence after which the job is judged hung: no rank printed a line for that long
    (or, with ``progress_pattern``, a rank that prints progress lines stopped while others go on).
    Every rank's Python stack goes into the task log, then the job is aborted. Default: off."""
    progress_pattern: str | None = None
    """A regular expression: only the lines it matches count as progress (for jobs that print
    heartbeats). Needs ``progress_timeout``. RE2 syntax, matched in time linear in the line: no
    backreferences or lookaround, ``\\z`` for Python's ``\\Z``, at most 1000 characters."""
    ssh_port: int = 22
    """sshd's port in every pod (1024 or above without root)."""
    pod: PodSettings = field(default_factory=PodSettings)
    """Kubernetes settings for every pod."""
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    """Gang scheduling and queues."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Small text files for the job's config directory ``/etc/mpi`` (the ConfigMap), ``{name: text}``:
    names of ``[-._a-zA-Z0-9]``, not the product's own, 960 KiB in all. ``@task.mpi`` ships its
    function this way."""

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
        data = typing.cast(Mapping[str, Any], check_text(data, "", issues))  # a mapping stays a mapping
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
