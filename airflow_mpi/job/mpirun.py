"""The mpiexec command line, built from the typed ``MPIOptions`` in the spelling of the job's
MPI: Open MPI 4.x (ORTE) or Hydra (MPICH, Intel MPI).

Split in two: the host part (``--host``/``--hostfile`` or ``-hosts``, and ``-np``) that the launch
script computes from the platform environment (docs/contract.md#host-and-np), and the *tail* (every
other option, then the rank wrapper and the user's command) that is rendered here and shipped to
the pod as ``/etc/mpi/mpiexec.args`` (quoted bash), with the launcher to run, its implementation
and the variables it runs with. ``build_mpiexec_argv`` joins both, exactly as the script will.
Which options are always added, and why: docs/contract.md#mpiexec-options.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from airflow_mpi.contract import DEFAULT_PATHS, PodPaths
from airflow_mpi.job.topology import Topology, render_mpi_hosts
from airflow_mpi.spec import HostsMode, MPIJobSpec
from airflow_mpi.spec.mpiexec_args import HYDRAS, OPEN_MPI

# Rank-wrapper variables: which pods hold ranks (for NODE_RANK) and the optional env file.
RANK_PODS_VAR = "AIRFLOW_MPI_RANK_PODS"
ENV_FILE_VAR = "AIRFLOW_MPI_ENV_FILE"
# Hydra has no --tag-output: the rank wrapper tags each line of its rank as Open MPI does.
TAG_OUTPUT_VAR = "AIRFLOW_MPI_TAG_OUTPUT"
# Hydra waits for the other ranks when one exits non-zero: the rank wrapper ends the job then.
ABORT_ON_EXIT_VAR = "AIRFLOW_MPI_ABORT_ON_EXIT"

# ``spec.timeout`` counts from mpiexec's start, as its own ``--timeout`` does; the task's side
# (the waiting runner, the deferred trigger) ends the job this long after it, so that mpiexec's
# own report (each rank's state) comes first and names the timeout.
TIMEOUT_GRACE = 3.0


def build_host_args(spec: MPIJobSpec, topology: Topology, paths: PodPaths = DEFAULT_PATHS) -> list[str]:
    """``--host h:n,...`` or ``--hostfile /etc/mpi/hostfile``, never both (docs/contract.md#hostfile-mode).
    Hydra reads no ``slots=`` hostfile, and Intel's places ranks by its own count per host unless
    a machine file says ``host:n``: the launch script writes the same hosts so, in both modes."""
    if spec.mpi.implementation in HYDRAS:
        # Hydra starts the ranks of the host it calls local without ssh; it knows the master's
        # own name only when told (else it ssh'd to itself, racing the master's own sshd).
        own = [h.host for h in topology.rank_hosts if h.pod == topology.master_pod]
        return ["-machinefile", paths.hydra_hosts, *(["-localhost", own[0]] if own else [])]
    if spec.hosts_mode is HostsMode.HOSTFILE:
        return ["--hostfile", paths.hostfile]
    return ["--host", render_mpi_hosts(topology)]


def build_mpiexec_tail(
    spec: MPIJobSpec,
    topology: Topology,
    paths: PodPaths = DEFAULT_PATHS,
    platform_env: Sequence[str] = (),
    open_mpi: int = 4,
) -> list[str]:
    """Every mpiexec argument after ``-np N``, ending with the rank wrapper and the command.
    ``platform_env``: the names of what the platform writes into every pod (ranks get them too);
    ``open_mpi``: the major version an Open MPI job's launcher turns out to be (4 or 5)."""
    exports = build_rank_exports(spec, topology, platform_env)
    if spec.mpi.implementation in HYDRAS:
        args = _hydra_options(spec, exports)
    else:
        args = _open_mpi_options(spec, paths, exports, open_mpi)
    return [*args, *spec.mpi.extra_args, *build_rank_command(spec, paths)]


# The parameters whose names changed from Open MPI 4 (ORTE) to 5 (PRRTE).
OPEN_MPI_NAMES = {
    4: {"fqdn": "orte_keep_fqdn_hostnames", "ssh": "plm_rsh_args", "tree": "plm_rsh_no_tree_spawn",
        "help": "orte_base_help_aggregate"},
    5: {"fqdn": "prte_keep_fqdn_hostnames", "ssh": "plm_ssh_args", "tree": "plm_ssh_no_tree_spawn",
        "help": "opal_base_help_aggregate"},
}  # fmt: skip


def _open_mpi_options(spec: MPIJobSpec, paths: PodPaths, exports: list[str], major: int) -> list[str]:
    """Open MPI 4.x (ORTE) or 5.x (PRRTE): the typed options, the product's MCA parameters, ``-x``
    exports. PRRTE ends the job on a rank's non-zero exit by itself; ``--npernode`` and
    ``--oversubscribe`` are mappings there; its ``--output tag`` writes ``[1,R]<stdout>: text`` (a
    space more), so the rank wrapper tags each line as Open MPI 4 does; it has no ``-q``."""
    mpi, names, prrte = spec.mpi, OPEN_MPI_NAMES[major], major >= 5
    if prrte:
        map_by = f"ppr:{mpi.npernode}:node" if mpi.npernode is not None else mpi.map_by
        args = ["--map-by", f"{map_by}:OVERSUBSCRIBE" if mpi.oversubscribe else map_by, "--bind-to", mpi.bind_to]
    else:
        args = ["--map-by", mpi.map_by, "--bind-to", mpi.bind_to]
        args += ["--npernode", str(mpi.npernode)] if mpi.npernode is not None else []
        args += ["--oversubscribe"] if mpi.oversubscribe else []
    # Any rank exiting non-zero ends the whole job (with 0, mpiexec returned 0 although a rank exited 3).
    mca = {} if prrte else {"orte_abort_on_non_zero_status": "1"}
    # Keep <pod>.<job>: Open MPI strips the domain otherwise, and known_hosts pins full names.
    mca[names["fqdn"]] = "1"
    # The job's own ssh config: key, pinned known_hosts, port, batch mode, timeouts.
    mca[names["ssh"]] = f"-F {paths.ssh_config}"
    if mpi.no_tree_spawn:
        mca[names["tree"]] = "1"
    if not mpi.help_aggregate:
        mca[names["help"]] = "0"
    args += _mca_args(spec, mca)
    args += ["--timeout", str(spec.timeout), "--report-state-on-timeout"]
    flags = (
        (mpi.tag_output and not prrte, "--tag-output"),
        (mpi.report_bindings, "--report-bindings"),
        (mpi.display_map, "--display-map"),
        (mpi.verbose, "-v"),
        # Open MPI 4: --debug starts a parallel debugger; debug-level logs are --debug-daemons.
        (mpi.debug, "--debug-daemons"),
        (mpi.leave_session_attached, "--leave-session-attached"),
        (mpi.quiet and not prrte, "-q"),
    )
    args += [flag for enabled, flag in flags if enabled]
    if mpi.wdir:
        args += ["-wdir", mpi.wdir]
    for item in exports:
        args += ["-x", item]
    if prrte and mpi.tag_output:
        args += ["-x", f"{TAG_OUTPUT_VAR}=1"]
    return args


def _mca_args(spec: MPIJobSpec, owned: dict[str, str]) -> list[str]:
    """``--mca NAME VALUE`` for the product's parameters, the typed ones, then ``mpi.mca``."""
    mpi = spec.mpi
    mca = dict(owned)
    for key in ("pml", "btl", "btl_tcp_if_include", "btl_tcp_if_exclude", "oob_tcp_if_include", "oob_tcp_if_exclude"):
        value = getattr(mpi, key)
        if value is not None:
            mca[key] = value
    mca.update(mpi.mca)
    return [item for key, value in mca.items() for item in ("--mca", key, value)]


def _hydra_options(spec: MPIJobSpec, exports: list[str]) -> list[str]:
    """Hydra (MPICH, Intel MPI): the typed options it shares with Open MPI, and the exports as
    ``-genvlist`` (names: the launch script drops those unset) and ``-genv NAME VALUE``. Only
    those reach the ranks: Hydra would pass the master's whole environment by default, and a
    worker's ranks must not see the master pod's own variables. A failed rank ends the job by
    Hydra's default; the ssh launch and the timeout are the launcher's variables
    (``build_launch_env``)."""
    mpi = spec.mpi
    args: list[str] = []
    if mpi.map_by != "slot":
        args += ["-map-by", mpi.map_by]
    if mpi.bind_to != "none":
        args += ["-bind-to", mpi.bind_to]
    if mpi.npernode is not None:
        args += ["-ppn", str(mpi.npernode)]
    if mpi.verbose:
        args.append("-verbose")
    if mpi.wdir:
        args += ["-wdir", mpi.wdir]
    names = [item for item in exports if "=" not in item]
    # No list would pass the master's whole environment: none, then, beside the -genv items.
    args += ["-genvlist", ",".join(names)] if names else ["-genvnone"]
    for item in exports:
        if "=" in item:
            name, _, value = item.partition("=")
            args += ["-genv", name, value]
    args += ["-genv", ABORT_ON_EXIT_VAR, "1"]
    if mpi.tag_output:
        args += ["-genv", TAG_OUTPUT_VAR, "1"]
    return args


def build_launch_env(spec: MPIJobSpec, paths: PodPaths = DEFAULT_PATHS) -> list[str]:
    """``NAME=VALUE`` items the launcher runs with: Hydra takes its ssh launch and its time limit
    from its environment (Open MPI takes both as options: none)."""
    if spec.mpi.implementation == "intel":  # Intel's Hydra: its own names for the same
        return [
            "I_MPI_HYDRA_BOOTSTRAP=ssh",
            f"I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS=-F {paths.ssh_config}",
            f"I_MPI_JOB_TIMEOUT={spec.timeout}",
        ]
    if spec.mpi.implementation not in HYDRAS:
        return []
    return [
        "HYDRA_LAUNCHER=ssh",
        # The job's own ssh config: key, pinned known_hosts, port, batch mode, timeouts.
        f"HYDRA_LAUNCHER_EXTRA_ARGS=-F {paths.ssh_config}",
        f"MPIEXEC_TIMEOUT={spec.timeout}",
    ]


def build_rank_exports(spec: MPIJobSpec, topology: Topology, platform_env: Sequence[str] = ()) -> list[str]:
    """``-x`` items: PATH/LD_LIBRARY_PATH by default, the user's env, the platform's (a rank on a
    worker gets only what mpiexec exports: sshd starts it without the pod's env), torch.distributed's
    rendezvous."""
    exports = list(spec.mpi.export_env)
    named = {item.split("=", 1)[0] for item in exports}
    exports += [name for name in [*spec.env, *platform_env] if name not in named]
    exports += [
        f"MASTER_ADDR={topology.rank0_host}",
        f"MASTER_PORT={spec.mpi.master_port}",
        f"{RANK_PODS_VAR}={','.join(h.pod for h in topology.rank_hosts)}",
    ]
    if spec.mpi.env_file:
        exports.append(f"{ENV_FILE_VAR}={spec.mpi.env_file}")
    return exports


def build_rank_command(spec: MPIJobSpec, paths: PodPaths = DEFAULT_PATHS) -> list[str]:
    """The rank wrapper (RANK/WORLD_SIZE/LOCAL_RANK/NODE_RANK, prompt abort of Python ranks) + command.

    ``bash`` is explicit: remote nodes must not depend on the script's mode bits
    (docs/contract.md#script-without-bash).
    """
    return ["bash", paths.launch_script, "rank", *spec.command]


def build_mpiexec_argv(
    spec: MPIJobSpec,
    topology: Topology,
    paths: PodPaths = DEFAULT_PATHS,
    platform_env: Sequence[str] = (),
    open_mpi: int = 4,
) -> list[str]:
    """The full command line the master's launch script execs: the launcher's variables, the
    launcher, Open MPI's root flag, hosts, ``-np``, the tail (``open_mpi``: its major version)."""
    launch_env = build_launch_env(spec, paths)
    root = ["--allow-run-as-root"] if spec.mpi.implementation == OPEN_MPI else []
    return [
        *(["env", *launch_env] if launch_env else []),
        spec.mpi.mpiexec,
        *root,
        *build_host_args(spec, topology, paths),
        "-np",
        str(topology.np),
        *build_mpiexec_tail(spec, topology, paths, platform_env, open_mpi),
    ]


def render_args_file(
    spec: MPIJobSpec, args: list[str], paths: PodPaths = DEFAULT_PATHS, open_mpi_5: Sequence[str] = ()
) -> str:
    """The bash the launch script sources: the implementation, the launcher, its variables and
    the tail (``open_mpi_5``: an Open MPI job's tail in 5.x names, the script's pick when its
    launcher says 5), each value single-quoted (``shlex.quote``), so any text, newlines
    included, arrives as exactly one argument and nothing is expanded."""

    def array(name: str, items: Sequence[str]) -> str:
        return f"{name}=(\n" + "".join(f"  {shlex.quote(item)}\n" for item in items) + ")\n"

    return (
        f"MPI_IMPLEMENTATION={shlex.quote(spec.mpi.implementation)}\n"
        f"MPI_LAUNCHER={shlex.quote(spec.mpi.mpiexec)}\n"
        + array("MPI_LAUNCH_ENV", build_launch_env(spec, paths))
        + array("MPI_ARGS_RENDERED", args)
        + (array("MPI_ARGS_RENDERED_OPEN_MPI_5", open_mpi_5) if open_mpi_5 else "")
    )
