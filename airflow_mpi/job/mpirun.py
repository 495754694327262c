"""The mpiexec command line (Open MPI 4.x names), built from the typed ``MPIOptions``.

Split in two: the host part (``--host``/``--hostfile`` and ``-np``) that the launch script
computes from the platform environment (docs/contract.md#host-and-np), and the *tail* (every other option, then the
rank wrapper and the user's command) that is rendered here and shipped to the pod as
``/etc/mpi/mpiexec.args`` (a quoted bash array). ``build_mpiexec_argv`` joins both, exactly as the script will.
Which options are always added, and why: docs/contract.md#mpiexec-options.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from airflow_mpi.contract import DEFAULT_PATHS, PodPaths
from airflow_mpi.job.topology import Topology, render_mpi_hosts
from airflow_mpi.spec import HostsMode, MPIJobSpec

MPIEXEC = "mpiexec"

# Rank-wrapper variables: which pods hold ranks (for NODE_RANK) and the optional env file.
RANK_PODS_VAR = "AIRFLOW_MPI_RANK_PODS"
ENV_FILE_VAR = "AIRFLOW_MPI_ENV_FILE"

# ``spec.timeout`` counts from mpiexec's start, as its own ``--timeout`` does; the task's side
# (the waiting runner, the deferred trigger) ends the job this long after it, so that mpiexec's
# own report (each rank's state) comes first and names the timeout.
TIMEOUT_GRACE = 3.0


def build_host_args(spec: MPIJobSpec, topology: Topology, paths: PodPaths = DEFAULT_PATHS) -> list[str]:
    """``--host h:n,...`` or ``--hostfile /etc/mpi/hostfile``, never both (docs/contract.md#hostfile-mode)."""
    if spec.hosts_mode is HostsMode.HOSTFILE:
        return ["--hostfile", paths.hostfile]
    return ["--host", render_mpi_hosts(topology)]


def build_mpiexec_tail(
    spec: MPIJobSpec, topology: Topology, paths: PodPaths = DEFAULT_PATHS, platform_env: Sequence[str] = ()
) -> list[str]:
    """Every mpiexec argument after ``-np N``, ending with the rank wrapper and the command.
    ``platform_env``: the names of what the platform writes into every pod (ranks get them too)."""
    mpi = spec.mpi
    args = ["--map-by", mpi.map_by, "--bind-to", mpi.bind_to]
    if mpi.npernode is not None:
        args += ["--npernode", str(mpi.npernode)]
    if mpi.oversubscribe:
        args.append("--oversubscribe")

    mca: dict[str, str] = {
        # Any rank exiting non-zero ends the whole job (with 0, mpiexec returned 0 although a rank exited 3).
        "orte_abort_on_non_zero_status": "1",
        # Keep <pod>.<job>: Open MPI strips the domain otherwise, and known_hosts pins full names.
        "orte_keep_fqdn_hostnames": "1",
        # The job's own ssh config: key, pinned known_hosts, port, batch mode, timeouts.
        "plm_rsh_args": f"-F {paths.ssh_config}",
    }
    if mpi.no_tree_spawn:
        mca["plm_rsh_no_tree_spawn"] = "1"
    for key in ("pml", "btl", "btl_tcp_if_include", "btl_tcp_if_exclude", "oob_tcp_if_include", "oob_tcp_if_exclude"):
        value = getattr(mpi, key)
        if value is not None:
            mca[key] = value
    if not mpi.help_aggregate:
        mca["orte_base_help_aggregate"] = "0"
    mca.update(mpi.mca)
    for key, value in mca.items():
        args += ["--mca", key, value]

    args += ["--timeout", str(spec.timeout), "--report-state-on-timeout"]
    flags = (
        (mpi.tag_output, "--tag-output"),
        (mpi.report_bindings, "--report-bindings"),
        (mpi.display_map, "--display-map"),
        (mpi.verbose, "-v"),
        # Open MPI 4: --debug starts a parallel debugger; debug-level logs are --debug-daemons.
        (mpi.debug, "--debug-daemons"),
        (mpi.leave_session_attached, "--leave-session-attached"),
        (mpi.quiet, "-q"),
    )
    args += [flag for enabled, flag in flags if enabled]
    if mpi.wdir:
        args += ["-wdir", mpi.wdir]

    for item in build_rank_exports(spec, topology, platform_env):
        args += ["-x", item]
    args += list(mpi.extra_args)
    return [*args, *build_rank_command(spec, paths)]


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
    spec: MPIJobSpec, topology: Topology, paths: PodPaths = DEFAULT_PATHS, platform_env: Sequence[str] = ()
) -> list[str]:
    """The full command line the master's launch script execs: root flag, hosts, ``-np``, the tail."""
    return [
        MPIEXEC,
        "--allow-run-as-root",
        *build_host_args(spec, topology, paths),
        "-np",
        str(topology.np),
        *build_mpiexec_tail(spec, topology, paths, platform_env),
    ]


def render_args_file(args: list[str]) -> str:
    """A bash array the launch script sources: each argument single-quoted (``shlex.quote``), so
    any text, newlines included, arrives as exactly one argument and nothing is expanded."""
    return "MPI_ARGS_RENDERED=(\n" + "".join(f"  {shlex.quote(arg)}\n" for arg in args) + ")\n"
