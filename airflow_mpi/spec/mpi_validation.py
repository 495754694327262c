"""The rules of the typed mpiexec options: Open MPI's names, and values safe where Open MPI
forwards them (``mpiexec_args`` reads ``extra_args`` and holds what the product owns)."""

from __future__ import annotations

import re
from dataclasses import fields
from typing import TYPE_CHECKING

from airflow_mpi.exceptions import SpecIssue
from airflow_mpi.spec.formats import CONTROL, mca_value_problem
from airflow_mpi.spec.mpiexec_args import (
    HYDRAS,
    IMPLEMENTATIONS,
    OWNED_FLAGS,
    OWNED_MCA,
    check_export,
    check_extra_args,
    check_mca,
)

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec

# What the product owns is read here too (its rules moved to mpiexec_args with the extra_args parser).
__all__ = ["BIND_TO", "MAP_BY", "MAX_RANKS", "MCA_EXAMPLES", "OWNED_FLAGS", "OWNED_MCA", "check_mpi"]

BIND_TO = {"none", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board"}
MAP_BY = {"slot", "hwthread", "core", "l1cache", "l2cache", "l3cache", "socket", "numa", "board", "node"}

MAX_RANKS = 65536  # mpi.np and mpi.npernode, oversubscribed or not

LAUNCHER = re.compile(r"^(?:/[A-Za-z0-9_.+-]+)+$|^[A-Za-z0-9_.+-]+$")  # a name on PATH, or an absolute path

# Open MPI's own options, each with what Hydra (MPICH, Intel MPI) offers instead: refused there.
OPEN_MPI_ONLY = {
    "mca": "Hydra has no MCA parameters: set the MPI's own variables in the spec's env",
    "pml": "Hydra has no MCA parameters",
    "btl": "Hydra has no MCA parameters",
    "btl_tcp_if_include": "Hydra picks the network interface with mpi.extra_args ['-iface', 'eth0']",
    "btl_tcp_if_exclude": "Hydra picks the network interface with mpi.extra_args ['-iface', 'eth0']",
    "oob_tcp_if_include": "Hydra picks the network interface with mpi.extra_args ['-iface', 'eth0']",
    "oob_tcp_if_exclude": "Hydra picks the network interface with mpi.extra_args ['-iface', 'eth0']",
    "oversubscribe": "Hydra places more ranks than slots by itself",
    "help_aggregate": "it is Open MPI's help-message setting",
    "display_map": "it is Open MPI's",
    "report_bindings": "it is Open MPI's",
    "leave_session_attached": "it is Open MPI's",
    "quiet": "it is Open MPI's",
    "debug": "Hydra's launch details come with mpi.verbose",
    "no_tree_spawn": "Hydra's master starts every proxy itself",
}


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
    issues = _check_implementation(spec)
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
    elif (problem := mca_value_problem(mpi.map_by)) is not None:  # it reaches the workers as an MCA value
        issues.append(SpecIssue("mpi.map_by", problem, "use e.g. 'slot', 'node' or 'ppr:2:node:PE=2'"))
    for key, example in MCA_EXAMPLES.items():
        value = getattr(mpi, key)
        if value is not None and (problem := mca_value_problem(value)) is not None:
            issues.append(SpecIssue(f"mpi.{key}", problem, f"use e.g. {example}"))
    if mpi.btl_tcp_if_include and mpi.btl_tcp_if_exclude:
        issues.append(
            SpecIssue("mpi.btl_tcp_if_exclude", "set together with mpi.btl_tcp_if_include", "Open MPI takes only one")
        )
    if mpi.oob_tcp_if_include and mpi.oob_tcp_if_exclude:
        issues.append(
            SpecIssue("mpi.oob_tcp_if_exclude", "set together with mpi.oob_tcp_if_include", "Open MPI takes only one")
        )
    for index, item in enumerate(mpi.export_env):
        issues += check_export(item, f"mpi.export_env[{index}]")
    for key in ("env_file", "wdir"):
        value = getattr(mpi, key)
        if value is not None and not value.startswith("/"):
            issues.append(SpecIssue(f"mpi.{key}", f"{value!r} is not an absolute path", "use a path inside the pod"))
        elif value is not None and CONTROL.search(value):
            issues.append(SpecIssue(f"mpi.{key}", f"{value!r} contains a control character", "use a plain path"))
    for name, value in mpi.mca.items():
        issues += check_mca(name, value, f"mpi.mca.{name}", f"mpi.mca.{name}")
    issues += check_extra_args(spec)
    if not 1 <= mpi.master_port <= 65535:
        issues.append(SpecIssue("mpi.master_port", f"is {mpi.master_port}", "use a TCP port 1-65535 (default 29500)"))
    if mpi.master_port == spec.ssh_port:
        issues.append(SpecIssue("mpi.master_port", "is the sshd port", "use another port (default 29500)"))
    return issues


def launcher_problem(launcher: str) -> str | None:
    """Why ``launcher`` cannot be a job's ``mpi.mpiexec`` (None: it can): a name on the PATH or
    an absolute path, nothing a shell would read."""
    if LAUNCHER.match(launcher) and len(launcher) <= 4096:
        return None
    return f"{launcher[:80]!r} is not a command name or an absolute path"


def _check_implementation(spec: MPIJobSpec) -> list[SpecIssue]:
    """The MPI named, its launcher's name, and no option of Open MPI's own for another MPI."""
    mpi = spec.mpi
    issues = []
    if mpi.implementation not in IMPLEMENTATIONS:
        issues.append(
            SpecIssue(
                "mpi.implementation",
                f"{mpi.implementation!r} is not an MPI airflow-mpi launches",
                f"use one of {list(IMPLEMENTATIONS)} (Intel MPI: 'intel')",
            )
        )
    if problem := launcher_problem(mpi.mpiexec):
        issues.append(SpecIssue("mpi.mpiexec", problem, "use e.g. 'mpiexec' or '/usr/bin/mpiexec.mpich'"))
    if mpi.implementation in HYDRAS:
        defaults = {f.name: f.default for f in fields(mpi) if f.name != "mca"}
        for key, instead in OPEN_MPI_ONLY.items():
            value = getattr(mpi, key)
            if (key == "mca" and value) or (key != "mca" and value != defaults[key]):
                issues.append(
                    SpecIssue(
                        f"mpi.{key}",
                        f"is Open MPI's; mpi.implementation is {mpi.implementation}",
                        f"remove it: {instead}",
                    )
                )
    return issues
