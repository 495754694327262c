"""The spec's semantic rules: every problem of a well-typed spec, each naming the field and the fix.

The job-level rules live here; the mpiexec options' and the pod settings' have their own modules.
Messages state each rule in full; docs/contract.md explains them with examples.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from airflow_mpi.contract import (
    JOB_HASH_LEN,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    HostsMode,
)
from airflow_mpi.exceptions import SpecIssue
from airflow_mpi.spec.command_validation import check_command
from airflow_mpi.spec.files_validation import check_files
from airflow_mpi.spec.formats import (
    CONTROL,
    DNS_LABEL,
    ENV_NAME,
    LABEL_VALUE,
    MAX_ARG_BYTES,
    RESOURCE_NAME,
    env_string_bytes,
    max_name_length,
    mca_value_problem,
)
from airflow_mpi.spec.mpi_validation import check_mpi
from airflow_mpi.spec.mpiexec_args import OWNED_LAUNCHER_ENV, OWNED_MCA, mca_of_variable
from airflow_mpi.spec.patterns import PatternError, compile_pattern
from airflow_mpi.spec.pod_validation import check_pod
from airflow_mpi.spec.quantities import CPU_MILLI, check_memory, parse_cpu, quantity_bound_problem, shown_quantity
from airflow_mpi.spec.run_as_validation import check_run_as
from airflow_mpi.spec.scheduling import check_scheduling
from airflow_mpi.spec.slots import build_slot_plan

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec


# Upper bounds: beyond them a job is a typo, and rendering it would exhaust memory (every pod's
# env lists every worker host) or overflow what mpiexec and Kubernetes accept.
MAX_WORKERS = 1000
MAX_GPUS = 64
MAX_CPU_CORES = 4096
MAX_TIMEOUT = 366 * 24 * 3600  # seconds
MAX_TERMINATION_GRACE = 3600  # seconds: a save that takes longer belongs in the training loop


def collect_spec_issues(spec: MPIJobSpec, skip: frozenset[str] = frozenset()) -> list[SpecIssue]:
    """Every semantic problem of a well-typed spec. ``skip``: fields already reported as mistyped."""
    checks = (
        _check_name,
        check_command,
        _check_roles,
        _check_slots,
        _check_env,
        check_mpi,
        _check_job_settings,
        check_pod,
        check_run_as,
        check_scheduling,
        check_files,
    )
    issues: list[SpecIssue] = []
    for check in checks:
        issues += [issue for issue in check(spec) if not _already_reported(issue.field, skip)]
    return issues


def _already_reported(field: str, skip: frozenset[str]) -> bool:
    """The field, or a part of it, was reported as mistyped: its stand-in says nothing more
    (``command`` is empty because ``command[1]`` was not a string)."""
    return any(field == s or field.startswith((s + ".", s + "[")) or s.startswith(field + "[") for s in skip)


def _check_name(spec: MPIJobSpec) -> list[SpecIssue]:
    name = spec.name
    if not isinstance(name, str) or not name:
        return [SpecIssue("name", "is empty", "give the job a short name such as 'train-digits'")]
    issues = []
    if not DNS_LABEL.match(name):
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
    elif spec.workers.replicas > MAX_WORKERS:
        issues.append(
            SpecIssue(
                "workers.replicas",
                f"is {spec.workers.replicas}; at most {MAX_WORKERS} workers (every pod's environment lists every "
                "worker host)",
                f"use at most {MAX_WORKERS} workers, each with more GPUs or cores",
            )
        )
    for role_name, role in (("master", spec.master), ("workers", spec.workers)):
        cores = parse_cpu(role.cpu)
        if (bound := quantity_bound_problem(role.cpu)) is not None:
            issues.append(
                SpecIssue(f"{role_name}.cpu", f"{shown_quantity(role.cpu)} {bound}", f"use at most {MAX_CPU_CORES}")
            )
        elif cores is None:
            issues.append(
                SpecIssue(f"{role_name}.cpu", f"{role.cpu!r} is not a CPU quantity", "use cores like 2, 0.5 or '500m'")
            )
        elif cores <= 0:
            issues.append(SpecIssue(f"{role_name}.cpu", f"is {role.cpu!r}", "give at least 1 core (or e.g. '500m')"))
        elif cores > MAX_CPU_CORES:  # before the remainder: a huge Decimal has none
            issues.append(
                SpecIssue(
                    f"{role_name}.cpu", f"{role.cpu!r} cores is more than any node has", f"use at most {MAX_CPU_CORES}"
                )
            )
        elif cores % CPU_MILLI:
            issues.append(SpecIssue(f"{role_name}.cpu", f"{role.cpu!r} is finer than 1m", "round to whole millicores"))
        if role.memory is not None:
            issues += check_memory(f"{role_name}.memory", role.memory)
        if role.gpus < 0:
            issues.append(SpecIssue(f"{role_name}.gpus", f"is {role.gpus}", "use 0 (CPU only) or more GPUs"))
        elif role.gpus > MAX_GPUS:
            issues.append(
                SpecIssue(
                    f"{role_name}.gpus", f"is {role.gpus}, more than a node has", f"use at most {MAX_GPUS} per pod"
                )
            )
        if role.gpu_type is not None and not (len(role.gpu_type) <= 63 and LABEL_VALUE.match(role.gpu_type)):
            issues.append(
                SpecIssue(
                    f"{role_name}.gpu_type",
                    f"{role.gpu_type!r} is not a node label value (it selects nodes by their GPU model label)",
                    "use the node's label value, e.g. 'NVIDIA-A100-SXM4-80GB' (at most 63 of [A-Za-z0-9._-])",
                )
            )
        if not RESOURCE_NAME.match(role.gpu_resource):
            issues.append(
                SpecIssue(
                    f"{role_name}.gpu_resource",
                    f"{role.gpu_resource!r} is not an extended resource name",
                    "use e.g. 'nvidia.com/gpu' or 'amd.com/gpu'",
                )
            )
    master, workers = spec.master, spec.workers
    if master.gpus > 0 and workers.gpus > 0 and workers.replicas > 0:  # docs/contract.md#host-and-np
        rule = (
            "when both roles use GPUs they must have the same GPU count per pod and the same GPU model "
            "and resource, since every slot is one GPU"
        )
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
    """The host/NP rules (docs/contract.md#host-and-np): whole-core CPU slots, a rank for every
    worker, MPI_NP >= 1, and mpi.np/npernode within the slots."""
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
                        "CPU cores, one rank per whole core",
                        "use a whole number of cores",
                    )
                )
    if spec.master.gpus > 0 and spec.workers.gpus == 0 and spec.workers.replicas > 0:
        issues.append(
            SpecIssue(
                "workers.gpus",
                f"is 0 while master.gpus is {spec.master.gpus}: the {spec.workers.replicas} worker(s) would get no "
                "rank, since with GPUs on the master only, only the master runs ranks",
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
        if not isinstance(name, str) or not ENV_NAME.match(name):
            issues.append(
                SpecIssue(path, f"{name!r} is not an environment variable name", "use [A-Za-z_][A-Za-z0-9_]*")
            )
            continue
        if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):  # docs/contract.md#reserved-names
            issues.append(
                SpecIssue(
                    path,
                    "is written by the platform or computed by the launch script; users must not set it "
                    "(the platform writes GJ_TRAINING_*, MPI_HOST and NCCL_IB_*, the launch script computes "
                    "MPI_NP and MPI_HOSTS, airflow-mpi sets AIRFLOW_MPI_*)",
                    "remove it from env; size the job with master/workers and hosts_mode instead",
                )
            )
        mca = mca_of_variable(name)
        if mca in OWNED_MCA:
            issues.append(SpecIssue(path, f"would change the owned MCA parameter {mca}: {OWNED_MCA[mca]}", "remove it"))
        if name in OWNED_LAUNCHER_ENV:
            owner = OWNED_LAUNCHER_ENV[name]
            issues.append(SpecIssue(path, f"is the launcher's, set by airflow-mpi: {owner}", "remove it"))
        if not isinstance(value, str):
            issues.append(SpecIssue(path, f"value {value!r} is not a string", "quote it"))
        elif "\0" in value:
            issues.append(SpecIssue(path, "contains a NUL byte", "remove it"))
        elif env_string_bytes(name, value) > MAX_ARG_BYTES:
            issues.append(
                SpecIssue(
                    path,
                    f"{name}=value is {env_string_bytes(name, value)} bytes; a process refuses any variable of "
                    "128 KiB or more (it would fail when the pod starts)",
                    "pass large data in a file (the spec's files, or a volume) and its path here",
                )
            )
        elif mca and (problem := mca_value_problem(value)) is not None:
            # mpiexec copies OMPI_MCA_* of its environment onto every worker daemon's command line.
            issues.append(SpecIssue(path, problem, "use e.g. 'tcp,self', '^openib' or '1'"))
    return issues


def _check_progress(spec: MPIJobSpec) -> list[SpecIssue]:
    """The hang watchdog's settings: a timeout within the job's, a pattern that compiles."""
    issues = []
    if spec.progress_timeout is not None and not 1 <= spec.progress_timeout <= MAX_TIMEOUT:
        issues.append(
            SpecIssue(
                "progress_timeout",
                f"is {spec.progress_timeout}",
                f"give the seconds of silence that mean a hang, e.g. 600 (1 to {MAX_TIMEOUT}), or leave it out",
            )
        )
    if spec.progress_pattern is not None:
        if spec.progress_timeout is None:
            issues.append(
                SpecIssue(
                    "progress_pattern",
                    "is set without progress_timeout",
                    "set progress_timeout (seconds without a matching line that mean a hang)",
                )
            )
        try:
            compiled = compile_pattern(spec.progress_pattern)
        except PatternError as error:
            issues.append(
                SpecIssue("progress_pattern", str(error), "match your progress lines simply, e.g. 'step \\d+'")
            )
        else:
            if compiled.search(""):
                issues.append(
                    SpecIssue(
                        "progress_pattern",
                        f"{spec.progress_pattern!r} matches an empty line, so every line would count",
                        "match your progress lines, e.g. 'step \\d+'",
                    )
                )
    return issues


def _check_job_settings(spec: MPIJobSpec) -> list[SpecIssue]:
    issues = []
    if not 1 <= spec.timeout <= MAX_TIMEOUT:
        issues.append(
            SpecIssue(
                "timeout", f"is {spec.timeout}", f"give the job's limit in seconds, e.g. 3600 (1 to {MAX_TIMEOUT})"
            )
        )
    if not 1 <= spec.startup_timeout <= MAX_TIMEOUT:
        issues.append(
            SpecIssue(
                "startup_timeout",
                f"is {spec.startup_timeout}",
                f"give seconds for pods and sshd to start, e.g. 300 (1 to {MAX_TIMEOUT})",
            )
        )
    if not 0 <= spec.termination_grace <= MAX_TERMINATION_GRACE:
        issues.append(
            SpecIssue(
                "termination_grace",
                f"is {spec.termination_grace}",
                f"give the seconds a rank has to save after SIGTERM, e.g. 30 (0 to {MAX_TERMINATION_GRACE})",
            )
        )
    issues += _check_progress(spec)
    if not 1 <= spec.ssh_port <= 65535:
        issues.append(SpecIssue("ssh_port", f"is {spec.ssh_port}", "use a TCP port 1-65535 (default 22)"))
    if spec.image and (re.search(r"\s", spec.image) or CONTROL.search(spec.image)):
        issues.append(
            SpecIssue("image", f"{spec.image!r} contains whitespace", "use an image reference, e.g. 'registry/train:1'")
        )
    if not isinstance(spec.hosts_mode, HostsMode):
        issues.append(SpecIssue("hosts_mode", f"{spec.hosts_mode!r} is not a hosts mode", "use 'host' or 'hostfile'"))
    return issues
