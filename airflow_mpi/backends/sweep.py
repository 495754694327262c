"""Sweeping what crashed owners left: the sandboxes whose owner process is gone, and (on request)
namespaces, links and hosts files of ours that no record names.

Only records that pass ``sandbox_state.record_problem`` are acted on (``sandbox.records``).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from airflow_mpi.backends.processes import netns_list, pids_in_netns, run_ip
from airflow_mpi.backends.sandbox import records
from airflow_mpi.backends.sandbox_state import BRIDGE_PREFIX, NETNS_HOSTS_DIR, NETNS_PREFIX, VETH_PREFIX

log = logging.getLogger(__name__)


def sweep(state_dir: Path, keep: Sequence[str] = ()) -> list[str]:
    """Destroy every sandbox whose owner process is gone (a crashed task, CLI run or test), unless
    it names a namespace or link that a live sandbox's record names too: that one is not its to
    delete (two sandboxes never get the same names)."""
    found = records(state_dir)
    live = {s.name for s in found if s.name in keep or s.owner_alive}
    claimed = {name for sandbox in found if sandbox.name in live for name in sandbox.names()}
    swept = []
    for sandbox in found:
        if sandbox.name in live:
            continue
        shared = sorted(sandbox.names() & claimed)
        if shared:
            log.warning("not sweeping sandbox %s: a live sandbox owns %s", sandbox.name, ", ".join(shared))
            continue
        sandbox.destroy()
        swept.append(sandbox.name)
    return swept


def sweep_orphans(state_dir: Path) -> list[str]:
    """Remove namespaces, links and hosts files of ours that no record describes and no process
    uses (e.g. after a state directory was deleted by hand). Only for an explicit clean-up: a
    sandbox of another state directory being created right now would look the same."""
    sweep(state_dir)
    known = records(state_dir)
    known_netns = {p.netns for s in known for p in s.pods.values()} | {s.bridge_netns for s in known if s.bridge_netns}
    known_links = {n for s in known for n in (s.bridge, *(p.veth for p in s.pods.values()))}
    removed = []
    for name in netns_list():
        if name.startswith(NETNS_PREFIX) and name not in known_netns and not pids_in_netns([name]):
            run_ip(["netns", "del", name], "", check=False)
            removed.append(f"network namespace {name}")
    for link in sorted(os.listdir("/sys/class/net")):
        if link.startswith((BRIDGE_PREFIX, VETH_PREFIX)) and link not in known_links:
            run_ip(["link", "del", link], "", check=False)
            removed.append(f"link {link}")
    for hosts in NETNS_HOSTS_DIR.glob(f"{NETNS_PREFIX}*"):
        if hosts.name not in known_netns:
            shutil.rmtree(hosts, ignore_errors=True)
            removed.append(f"hosts directory {hosts}")
    return removed
