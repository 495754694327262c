"""The rules of the mpiexec options: Open MPI's names, and what the product sets itself."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from airflow_mpi.contract import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES
from airflow_mpi.exceptions import SpecIssue
from airflow_mpi.spec.formats import CONTROL, ENV_NAME, MCA_NAME

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec

BIND_TO = {"none", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board"}
MAP_BY = {"slot", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board", "node"}

# MCA parameters the product sets itself: changing them breaks host names, ssh or abort
# (docs/contract.md#mpiexec-options).
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


MAX_RANKS = 65536  # mpi.np and mpi.npernode, oversubscribed or not


# The typed --mca options, each with an example value for its message.
MCA_EXAMPLES = {
    "pml": "'ob1' or 'ucx'",
    "btl": "'tcp,self' or '^openib'",
    "btl_tcp_if_include": "'eth0' or '10.0.0.0/8'",
    "btl_tcp_if_exclude": "'lo,docker0'",
    "oob_tcp_if_include": "'eth0' or '10.0.0.0/8'",
    "oob_tcp_if_exclude": "'lo,docker0'",
}


def check_mpi(spec: MPIJobSpec) -> list[SpecIssue]:
    mpi = spec.mpi
    issues = []
    for key in ("np", "npernode"):
        value = getattr(mpi, key)
        if value is not None and value < 1:
            issues.append(SpecIssue(f"mpi.{key}", f"is {value}", "use at least 1, or leave it out to use every slot"))
        elif value is not None and value > MAX_RANKS:
            issues.append(SpecIssue(f"mpi.{key}", f"is {value}", f"use at most {MAX_RANKS}, or leave it out"))
    if mpi.bind_to not in BIND_TO:
        issues.append(
            SpecIssue("mpi.bind_to", f"{mpi.bind_to!r} is not an Open MPI binding", f"use one of {sorted(BIND_TO)}")
        )
    map_target = mpi.map_by.split(":", 1)[0].lower()
    if map_target not in MAP_BY and not map_target.startswith("ppr"):
        issues.append(
            SpecIssue(
                "mpi.map_by", f"{mpi.map_by!r} is not an Open MPI mapping", "use 'slot' (one rank per slot) or 'node'"
            )
        )
    for key, example in MCA_EXAMPLES.items():
        value = getattr(mpi, key)
        if value is not None and (not value or re.search(r"\s", value)):
            issues.append(SpecIssue(f"mpi.{key}", f"{value!r} is empty or contains spaces", f"use e.g. {example}"))
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
        if not ENV_NAME.match(name):
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
        elif value is not None and CONTROL.search(value):
            issues.append(SpecIssue(f"mpi.{key}", f"{value!r} contains a control character", "use a plain path"))
    for name, value in mpi.mca.items():
        path = f"mpi.mca.{name}"
        if not MCA_NAME.match(name):
            issues.append(SpecIssue(path, "is not an MCA parameter name", "use e.g. btl_tcp_if_include"))
        elif name in OWNED_MCA:
            issues.append(SpecIssue(path, f"is set by airflow-mpi: {OWNED_MCA[name]}", "remove it"))
        if not isinstance(value, str) or not value or CONTROL.search(value):
            issues.append(
                SpecIssue(path, f"value {value!r} must be a non-empty string on one line", "quote it, e.g. '1'")
            )
    for index, arg in enumerate(mpi.extra_args):
        path = f"mpi.extra_args[{index}]"
        if CONTROL.search(arg) or not arg.strip():
            issues.append(
                SpecIssue(
                    path,
                    f"{arg!r} is empty or contains a newline or control character; no mpiexec option does",
                    "give each option and each value as its own item, e.g. ['--report-bindings']",
                )
            )
            continue
        flag = arg.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            owner = OWNED_FLAGS[flag]
            if owner == "hosts_mode":
                problem = (
                    f"{flag!r}: the launch script already passes the hosts ({spec.hosts_mode.value} mode); "
                    "--host and a hostfile must never both be given to mpiexec"
                )
                fix = (
                    "remove it and choose hosts_mode: host (a --host list from the pod resources) "
                    "or hostfile (/etc/mpi/hostfile)"
                )
            else:
                problem = f"{flag!r} is set by airflow-mpi"
                fix = f"use {owner} instead" if owner.startswith(("mpi.", "timeout")) else "remove it"
            issues.append(SpecIssue(path, problem, fix))
    if not 1 <= mpi.master_port <= 65535:
        issues.append(SpecIssue("mpi.master_port", f"is {mpi.master_port}", "use a TCP port 1-65535 (default 29500)"))
    if mpi.master_port == spec.ssh_port:
        issues.append(SpecIssue("mpi.master_port", "is the sshd port", "use another port (default 29500)"))
    return issues
