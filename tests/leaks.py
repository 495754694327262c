"""What the tests check is never left behind: our namespaces, links and processes.

The real-Node tier runs beside the others (``tests/lanes.py``) and checks its own: processes in a
real Node's cgroups are its, not these checks' (``node_processes``), and its host-state check
leaves out the local sandbox's names.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

NODE_CGROUP_MARK = "/airflow-mpi-node-"  # tests/cluster/nodes.py: each Node's kubelet cgroupRoot
# Every MPI's launcher and daemons, as /proc/PID/comm names them (15 characters at most): Open MPI
# 4 (orted) and 5 (prted), Hydra's (MPICH, Intel MPI) launcher and proxies.
LAUNCHER_PROCESSES = frozenset(
    {"orted", "mpiexec", "mpirun", "prted", "prterun", "mpiexec.hydra", "mpiexec.mpich", "hydra_pmi_proxy",
     "hydra_bstrap_pr"}
)  # fmt: skip


def ours() -> list[str]:
    """Everything of ours that could leak, as readable strings (real Nodes' containers aside)."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith("ampl-")]
    links = Path("/sys/class/net")
    found += [f"link {p.name}" for p in links.iterdir() if p.name.startswith(("ampb", "ampv"))]
    found += [line for line, in_node in _job_processes() if not in_node]
    return found


def node_processes() -> list[str]:
    """Job processes (mpiexec, orted, our sshd) still in a real Node's containers."""
    return [line for line, in_node in _job_processes() if in_node]


def _job_processes() -> list[tuple[str, bool]]:
    """(description, runs in a real Node's cgroup) for every mpiexec, orted and sshd of ours."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = (proc / "comm").read_text().strip()
            if comm in LAUNCHER_PROCESSES or (comm == "sshd" and "/run/airflow-mpi" in cmdline):
                in_node = NODE_CGROUP_MARK in (proc / "cgroup").read_text()
                found.append((f"process {proc.name} {cmdline[:120]}", in_node))
        except OSError:
            continue
    return found
