"""What the tests check is never left behind: our namespaces, links and processes."""

from __future__ import annotations

import subprocess
from pathlib import Path


def ours() -> list[str]:
    """Everything of ours that could leak, as readable strings."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith("ampl-")]
    links = Path("/sys/class/net")
    found += [f"link {p.name}" for p in links.iterdir() if p.name.startswith(("ampb", "ampv"))]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if comm in ("orted", "mpiexec", "mpirun", "prted") or (comm == "sshd" and "/run/airflow-mpi" in cmdline):
            found.append(f"process {proc.name} {cmdline[:120]}")
    return found
