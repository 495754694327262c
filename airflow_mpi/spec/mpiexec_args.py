"""``mpi.extra_args`` read as mpiexec reads them (Open MPI 4.1), and the rules every value that
reaches the launcher follows.

mpiexec takes an option's values from the items after it (``--mca NAME VALUE``, ``-x VAR``), never
from ``--option=value`` and never from an abbreviation. extra_args may add options, but may not
say what the product owns (hosts, ``-np``, the ssh launch, abort on a failed rank, the timeout,
the reserved variables), however it is spelled. Open MPI copies MCA parameters, and the options
that set them, onto each worker daemon's command line, which ssh hands to a login shell: those
values keep to ``formats.MCA_VALUE``. ``-x`` values travel in the launch message, not on that
command line: they follow the environment's rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_mpi.contract import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES
from airflow_mpi.exceptions import SpecIssue
from airflow_mpi.spec.formats import CONTROL, ENV_NAME, MAX_ARG_BYTES, MCA_NAME, env_string_bytes, mca_value_problem

if TYPE_CHECKING:
    from airflow_mpi.spec.types import MPIJobSpec

# MCA parameters the product sets itself, and their synonyms: changing them breaks host names,
# ssh or abort (docs/contract.md#mpiexec-options).
_SSH = "the launch uses the job's ssh configuration"
OWNED_MCA = {
    "orte_abort_on_non_zero_status": "a rank that exits non-zero must end the job (with 0, mpiexec "
    "returned 0 although a rank exited 3)",
    "plm_rsh_agent": _SSH,
    "orte_rsh_agent": _SSH,
    "pls_rsh_agent": _SSH,
    "plm_rsh_args": _SSH,
    "orte_launch_agent": "the daemon ssh starts on every worker is Open MPI's own orted",
    "orte_keep_fqdn_hostnames": "pod host names are <pod>.<job> and must stay fully qualified",
    # Open MPI 5 (PRRTE) names for the same things.
    "plm_ssh_agent": _SSH,
    "plm_ssh_args": _SSH,
    "prte_launch_agent": "the daemon ssh starts on every worker is Open MPI's own prted",
    "prte_keep_fqdn_hostnames": "pod host names are <pod>.<job> and must stay fully qualified",
}
# The variables that set an MCA parameter: Open MPI's, PRRTE's (Open MPI 5) and PMIx's.
MCA_ENV_PREFIXES = ("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_")
# The MPIs a job may name; MPICH and Intel MPI both launch with Hydra, in one spelling.
OPEN_MPI = "openmpi"
HYDRAS = frozenset({"mpich", "intel"})
IMPLEMENTATIONS = (OPEN_MPI, "mpich", "intel")

# Hydra's (MPICH's, Intel MPI's) variables for the same things: the ssh launch, the hosts, the
# environment passed to ranks, the time limit. In a spec's env they reach the master's launcher.
OWNED_LAUNCHER_ENV = {
    **dict.fromkeys(("HYDRA_LAUNCHER", "HYDRA_LAUNCHER_EXEC", "HYDRA_LAUNCHER_EXTRA_ARGS"), _SSH),
    **dict.fromkeys(("HYDRA_BOOTSTRAP", "HYDRA_BOOTSTRAP_EXEC", "I_MPI_HYDRA_BOOTSTRAP"), _SSH),
    **dict.fromkeys(("I_MPI_HYDRA_BOOTSTRAP_EXEC", "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS"), _SSH),
    **dict.fromkeys(("HYDRA_HOST_FILE", "I_MPI_HYDRA_HOST_FILE"), "the launch script passes the hosts"),
    **dict.fromkeys(("HYDRA_ENV", "I_MPI_HYDRA_ENV"), "only the exported variables may reach the ranks"),
    **dict.fromkeys(("MPIEXEC_TIMEOUT", "I_MPI_MPIEXEC_TIMEOUT", "I_MPI_JOB_TIMEOUT"), "the job's timeout sets it"),
    # Hydra reads launcher options from this file: a job's would add them past extra_args' rules.
    "HYDRA_CONFIG_FILE": "the launcher's options are the job's, from no file",
}
# Each takes NAME VALUE; Open MPI 5 also spells them --prtemca (PRRTE's) and --pmixmca (PMIx's).
MCA_OPTIONS = frozenset({"--mca", "-mca", "--gmca", "-gmca", "--prtemca", "-prtemca", "--pmixmca", "-pmixmca"})
EXPORT_OPTIONS = frozenset({"-x", "--x"})

_HOSTS = "hosts_mode"
_ABORT = "(a failed rank ends the job)"
_FILES = "(a file of options)"
# Flags the launch script sets, that the typed options already express, or that would undo
# what the product owns; Open MPI 4.1 spells each with one dash or two.
OWNED_FLAGS = {
    **dict.fromkeys(("-H", "-host", "--host", "-hostfile", "--hostfile"), _HOSTS),
    **dict.fromkeys(("-machinefile", "--machinefile", "-default-hostfile", "--default-hostfile"), _HOSTS),
    **dict.fromkeys(("-np", "--np", "-n", "--n", "-c"), "mpi.np"),
    **dict.fromkeys(("-allow-run-as-root", "--allow-run-as-root"), "(always set)"),
    **dict.fromkeys(("-timeout", "--timeout"), "timeout"),
    **dict.fromkeys(("-enable-recovery", "--enable-recovery", "-continuous", "--continuous"), _ABORT),
    **dict.fromkeys(("-max-restarts", "--max-restarts"), _ABORT),
    **dict.fromkeys(("-launch-agent", "--launch-agent"), "(the ssh launch)"),
    **dict.fromkeys(("--app", "-app", "-am", "--am", "-tune", "--tune"), _FILES),
}


# Hydra's flags (one dash) for what the product owns, and its exports: -genv NAME VALUE, and lists of names.
HYDRA_OWNED_FLAGS = {
    **dict.fromkeys(("-hosts", "-host", "-f", "-hostfile", "-machinefile", "-machine", "-configfile"), _HOSTS),
    **dict.fromkeys(("-np", "-n"), "mpi.np"),
    **dict.fromkeys(("-ppn", "-perhost"), "mpi.npernode"),
    **dict.fromkeys(("-launcher", "-launcher-exec", "-bootstrap", "-bootstrap-exec", "-rmk"), "(the ssh launch)"),
    **dict.fromkeys(("-bootstrap-exec-args", "-launcher-exec-args"), "(the ssh launch)"),
    **dict.fromkeys(("-genvnone", "-genvall", "-envall", "-envnone", "-genvlist", "-envlist"), "mpi.export_env"),
    **dict.fromkeys(("-disable-auto-cleanup", "-auto-cleanup"), _ABORT),
}
HYDRA_EXPORT_OPTIONS = frozenset({"-genv", "-env"})  # each takes NAME VALUE


def check_extra_args(spec: MPIJobSpec) -> list[SpecIssue]:
    """Every problem of ``mpi.extra_args``, each naming the item (``mpi.extra_args[3]``) and the fix."""
    if spec.mpi.implementation in HYDRAS:
        return _check_hydra_args(spec)
    args = spec.mpi.extra_args
    issues: list[SpecIssue] = []
    index = 0
    while index < len(args):
        arg, path = args[index], f"mpi.extra_args[{index}]"
        if CONTROL.search(arg) or not arg.strip():
            issues.append(
                SpecIssue(
                    path,
                    f"{arg[:80]!r} is empty or contains a newline or control character; no mpiexec option does",
                    "give each option and each value as its own item, e.g. ['--report-bindings']",
                )
            )
            index += 1
            continue
        flag = arg.split("=", 1)[0]
        if flag in MCA_OPTIONS | EXPORT_OPTIONS and (flag != arg or index + 1 >= len(args)):
            # mpiexec reads no --option=value: it would fail on it, or take the next items.
            values = "its variable as the next item"
            if flag in MCA_OPTIONS:
                values = "a name and a value as the next two items"
            issues.append(SpecIssue(path, f"{arg[:80]!r}: {flag} takes {values}", f"e.g. ['{flag}', ...]"))
            index += 1
        elif flag in MCA_OPTIONS:
            issues += _check_mca_option(args, index)
            index += 3
        elif flag in EXPORT_OPTIONS:
            issues += check_export(args[index + 1], f"mpi.extra_args[{index + 1}]")
            index += 2
        elif flag in OWNED_FLAGS:
            issues.append(_owned_flag(spec, flag, path))
            index += 1
        else:
            unsafe = mca_value_problem(arg)
            if unsafe is not None:
                issues.append(SpecIssue(path, unsafe, "pass such text to your command, not to mpiexec"))
            index += 1
    return issues


def _check_hydra_args(spec: MPIJobSpec) -> list[SpecIssue]:
    """``mpi.extra_args`` read as Hydra reads them: one-dash flags, ``-genv NAME VALUE``."""
    args, implementation = spec.mpi.extra_args, spec.mpi.implementation
    issues: list[SpecIssue] = []
    index = 0
    while index < len(args):
        arg, path = args[index], f"mpi.extra_args[{index}]"
        if CONTROL.search(arg) or not arg.strip():
            problem = f"{arg[:80]!r} is empty or contains a newline or control character"
            issues.append(SpecIssue(path, problem, "give each option and value as one item, e.g. ['-iface', 'eth0']"))
            index += 1
        elif arg in HYDRA_EXPORT_OPTIONS:
            if index + 2 >= len(args):
                problem = f"{arg!r} takes a name and a value as the next two items"
                issues.append(SpecIssue(path, problem, "or use the spec's env, which reaches every rank"))
                break
            issues += check_export(f"{args[index + 1]}={args[index + 2]}", f"mpi.extra_args[{index + 1}]")
            index += 3
        elif arg in HYDRA_OWNED_FLAGS:
            issues.append(_owned_flag(spec, arg, path, HYDRA_OWNED_FLAGS))
            index += 1
        elif arg in MCA_OPTIONS | EXPORT_OPTIONS or arg.startswith("--"):
            problem = f"{arg[:80]!r} is Open MPI's; mpi.implementation is {implementation} (Hydra)"
            issues.append(SpecIssue(path, problem, "use Hydra's spelling (-iface eth0), the spec's env for variables"))
            index += 1
        else:
            unsafe = mca_value_problem(arg)
            if unsafe is not None:
                issues.append(SpecIssue(path, unsafe, "pass such text to your command, not to mpiexec"))
            index += 1
    return issues


def _check_mca_option(args: tuple[str, ...], index: int) -> list[SpecIssue]:
    """``--mca NAME VALUE`` in extra_args: the same rules as ``mpi.mca``."""
    flag, path = args[index], f"mpi.extra_args[{index}]"
    if index + 2 >= len(args):
        return [SpecIssue(path, f"{flag!r} needs a name and a value as the next two items", "use mpi.mca instead")]
    name, value = args[index + 1], args[index + 2]
    return check_mca(name, value, f"mpi.extra_args[{index + 1}]", f"mpi.extra_args[{index + 2}]", "use mpi.mca")


def check_mca(name: str, value: object, name_path: str, value_path: str, fix: str = "") -> list[SpecIssue]:
    """One MCA parameter: a name Open MPI knows the shape of, not one the product owns, and a
    value safe on a worker's command line."""
    issues = []
    if not MCA_NAME.match(name):
        issues.append(
            SpecIssue(name_path, f"{name[:80]!r} is not an MCA parameter name", "use e.g. btl_tcp_if_include")
        )
    elif name in OWNED_MCA:
        issues.append(SpecIssue(name_path, f"{name} is set by airflow-mpi: {OWNED_MCA[name]}", "remove it"))
    if not isinstance(value, str):
        issues.append(SpecIssue(value_path, f"value {value!r} is not a string", "quote it, e.g. '1'"))
        return issues
    problem = mca_value_problem(value)
    if problem is not None:
        example = "e.g. 'tcp,self', '^openib', '10.0.0.0/8' or '1'"
        issues.append(SpecIssue(value_path, f"value {problem}", f"{fix}; {example}" if fix else f"use {example}"))
    return issues


def check_export(item: str, path: str) -> list[SpecIssue]:
    """One ``-x VAR`` or ``-x VAR=value`` (``mpi.export_env`` and ``-x`` in extra_args)."""
    name, _, value = item.partition("=")
    if not ENV_NAME.match(name):
        return [SpecIssue(path, f"{item[:80]!r} is not VAR or VAR=value", "use e.g. 'NCCL_DEBUG=INFO'")]
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        return [SpecIssue(path, f"{name} is owned by the platform", "remove it")]
    mca = mca_of_variable(name)
    if mca in OWNED_MCA:
        return [SpecIssue(path, f"{name} would change {mca}, set by airflow-mpi: {OWNED_MCA[mca]}", "remove it")]
    if name in OWNED_LAUNCHER_ENV:
        return [SpecIssue(path, f"{name} is set by airflow-mpi: {OWNED_LAUNCHER_ENV[name]}", "remove it")]
    if CONTROL.search(value):
        return [SpecIssue(path, f"{name}'s value contains a newline or control character", "give a value on one line")]
    size = env_string_bytes(name, value)
    if size > MAX_ARG_BYTES:
        return [
            SpecIssue(
                path,
                f"is {size} bytes; a process refuses any argument or variable of 128 KiB or more",
                "pass large data in a file (the spec's files, or a volume)",
            )
        ]
    return []


def mca_of_variable(name: str) -> str:
    """The MCA parameter an environment variable sets (``OMPI_MCA_btl`` -> ``btl``), or ""."""
    prefix = next((prefix for prefix in MCA_ENV_PREFIXES if name.startswith(prefix)), "")
    return name[len(prefix) :] if prefix else ""


def _owned_flag(spec: MPIJobSpec, flag: str, path: str, owned: dict[str, str] = OWNED_FLAGS) -> SpecIssue:
    owner = owned[flag]
    if owner == _HOSTS:
        return SpecIssue(
            path,
            f"{flag!r}: the launch script already passes the hosts ({spec.hosts_mode.value} mode); "
            "--host and a hostfile must never both be given to mpiexec",
            "remove it and choose hosts_mode: host (a --host list from the pod resources) "
            "or hostfile (/etc/mpi/hostfile)",
        )
    if owner == _ABORT:
        return SpecIssue(path, f"{flag!r} would keep the job running after a rank fails", "remove it")
    if owner == _FILES:
        return SpecIssue(
            path,
            f"{flag!r} reads mpiexec options or MCA parameters from a file, past these rules",
            "give MCA parameters in mpi.mca and options in mpi.extra_args",
        )
    fix = f"use {owner} instead" if owner.startswith(("mpi.", "timeout")) else "remove it"
    if owner == "mpi.export_env":
        fix = "name the variables in mpi.export_env or the spec's env: only those reach the ranks"
    return SpecIssue(path, f"{flag!r} is set by airflow-mpi", fix)
