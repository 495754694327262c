"""Processes and network namespaces of this machine, for the sandboxes: ``ip`` itself, which
namespaces and links exist, which processes live in a namespace, and killing by PID with the
process's start time checked (a PID the kernel reused is never killed), and whether a PID is
still a pod's first process (a PID read from a state record chooses nothing root kills).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from airflow_mpi.exceptions import LaunchError


def run_ip(args: list[str], script: str, *, check: bool = True) -> None:
    done = subprocess.run(["ip", *args], input=script, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise LaunchError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def netns_list() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def netns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def link_exists(name: str, netns: str | None = None) -> bool:
    """A network link of the host's namespace, or of the named namespace ``netns`` (asked
    through ``ip -n``: its /sys is not this process's to read)."""
    if netns is None:
        return os.path.exists(f"/sys/class/net/{name}")
    if not netns_exists(netns):
        return False
    shown = subprocess.run(["ip", "-n", netns, "link", "show", "dev", name], capture_output=True, check=False)
    return shown.returncode == 0


def host_networks() -> set[str]:
    """IPv4 networks already on this host's interfaces (never allocate over them)."""
    done = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=False)
    networks = set()
    with contextlib.suppress(ValueError, KeyError):
        for link in json.loads(done.stdout or "[]"):
            for addr in link.get("addr_info", []):
                networks.add(str(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False)))
    return networks


def start_ticks(pid: int) -> int | None:
    """A process's start time (guards against PID reuse); None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def is_pod_process(pid: int, start: int | None, netns: str) -> bool:
    """Whether ``pid`` is still the first process a sandbox started for the pod of ``netns``: it
    started at ``start`` (``/proc/<pid>/stat`` field 22; a reused PID started later), and it is
    ours: ``pod-init`` is in its command line and it runs in the pod's network namespace (or, as
    ``ip netns exec`` before entering it, names that namespace)."""
    if start is None or start_ticks(pid) != start:
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if b"pod-init" not in argv:
        return False
    if netns.encode() in argv:
        return True
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{netns}").st_ino
    except OSError:
        return False


def pids_in_netns(names: Sequence[str]) -> list[int]:
    """Processes whose network namespace is one of ``names`` (what ``ip netns pids`` does)."""
    inodes = set()
    for name in names:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/run/netns/{name}").st_ino)
    if not inodes:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry.name}/ns/net").st_ino in inodes:
                    pids.append(int(entry.name))
    return pids


def kill_all(pids: list[int], timeout: float = 5) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(start_ticks(pid) is not None for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def stop_pod_init(unshare_pid: int) -> None:
    """Kill the pod's first process (its PID namespace's init): the kernel then kills and reaps
    everything in the pod, and ``unshare`` exits by itself, so nothing is left as a zombie."""
    children = child_pids(unshare_pid)
    if not children:
        kill_group(unshare_pid)
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def wait_gone(pid: int, start: int | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while start_ticks(pid) == start and time.monotonic() < deadline:
        time.sleep(0.02)
