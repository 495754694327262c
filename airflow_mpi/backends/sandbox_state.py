"""What a sandbox's state on disk may be: the names a sandbox gives out, the rules a record
(``<state_dir>/<name>/sandbox.json``) is read back by, and the state directory itself.

Root deletes the namespaces, links and directories a record names, so a record is used only
when every name in it is the one these rules derive from its sandbox's name; and the state
directory must be root's alone, or another user could plant or edit a record first.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from airflow_mpi.exceptions import BackendUnavailable, LaunchError

DEFAULT_STATE_DIR = Path("/run/airflow-mpi-local")
SUBNET_POOL = ipaddress.IPv4Network("10.244.0.0/16")
NETNS_PREFIX = "ampl-"
BRIDGE_PREFIX = "ampb"
VETH_PREFIX = "ampv"
NETNS_HOSTS_DIR = Path("/etc/netns")
RECORD = "sandbox.json"
MAX_PODS = 253  # one /24 per sandbox
# Sandbox and pod names: DNS-1123 subdomains (job and pod names are), so never a path (no "/",
# never "." or ".."), and the same rule when a record is read back.
NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
MAX_NAME = 253
RECORD_FIELDS = frozenset(
    {"name", "subnet", "bridge", "bridge_netns", "owner_pid", "owner_start", "meta", "next_index", "pods"}
)
POD_FIELDS = frozenset({"name", "netns", "veth", "ip", "meta", "pid", "pid_start"})


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a sandbox or a pod (None when it can)."""
    if len(name) > MAX_NAME or not NAME.fullmatch(name):
        return f"is not a DNS-1123 name of at most {MAX_NAME} characters (lower-case letters, digits, '-', '.')"
    return None


def bridge_name(sandbox: str) -> str:
    return f"{BRIDGE_PREFIX}{hashlib.sha256(sandbox.encode()).hexdigest()[:8]}"


def bridge_netns_name(sandbox: str) -> str:
    """The namespace holding a sandbox's bridge when the host stays off it: ``ampl-`` like the
    pods' (sweeps and leak checks find it by that prefix), and with a ``_``, which no pod name
    (DNS-1123) has, so it is never a pod's namespace."""
    return f"{NETNS_PREFIX}net_{hashlib.sha256(sandbox.encode()).hexdigest()[:8]}"


def veth_name(sandbox: str, index: int) -> str:
    return f"{VETH_PREFIX}{hashlib.sha256(sandbox.encode()).hexdigest()[:6]}x{index}"


def free_pod_index(sandbox: str, hosts: list[Any], pods: Iterable[Any], link_exists: Callable[[str], bool]) -> int:
    """The lowest pod index whose address no live pod holds and whose veth is gone (a pod being
    removed keeps it a moment): a long-lived sandbox (the test cluster's node agent) makes more
    pods in its life than its /24 has addresses, so their addresses are handed out again."""
    taken = {pod.ip for pod in pods}
    free = (i for i in range(len(hosts) - 1) if str(hosts[i + 1]) not in taken)
    index = next((i for i in free if not link_exists(veth_name(sandbox, i))), None)
    if index is None:
        raise LaunchError(f"local pods: more than {len(hosts) - 1} pods at once in {sandbox}")
    return index


def _whole(value: Any, low: int, high: int | None = None) -> bool:
    return type(value) is int and value >= low and (high is None or value <= high)


def record_problem(data: Any, name: str) -> str | None:
    """What in a record read from ``<state_dir>/<name>/sandbox.json`` breaks the rules that made
    it (None when nothing does): every name it holds must be the one ``create`` and ``add_pods``
    derive, so a record names no path, namespace or link outside this sandbox's own."""
    if not isinstance(data, dict) or set(data) != RECORD_FIELDS:
        return f"its fields are not {sorted(RECORD_FIELDS)}"
    if data["name"] != name:
        return f"name {data['name']!r} is not its directory's"
    if not (_whole(data["owner_pid"], 1) and _whole(data["owner_start"], 0)):
        return "owner_pid/owner_start are not a process"
    if not _whole(data["next_index"], 0, MAX_PODS):
        return f"next_index {data['next_index']!r} is not 0..{MAX_PODS}"
    if not isinstance(data["meta"], dict) or not isinstance(data["pods"], dict):
        return "meta and pods must be objects"
    try:
        subnet = ipaddress.IPv4Network(data["subnet"])
    except (ValueError, TypeError):
        return f"subnet {data['subnet']!r} is not an IPv4 network"
    if subnet.prefixlen != 24 or not subnet.subnet_of(SUBNET_POOL):
        return f"subnet {subnet} is not a /24 of {SUBNET_POOL}"
    if data["bridge"] != bridge_name(name):
        return f"bridge {data['bridge']!r} is not {bridge_name(name)}"
    if data["bridge_netns"] not in (None, bridge_netns_name(name)):
        return f"bridge_netns {data['bridge_netns']!r} is neither null nor {bridge_netns_name(name)}"
    hosts = list(subnet.hosts())
    indexes = set()
    for key, pod in data["pods"].items():
        if not isinstance(pod, dict) or set(pod) != POD_FIELDS:
            return f"pod {key!r}: its fields are not {sorted(POD_FIELDS)}"
        if pod["name"] != key or name_problem(key):
            return f"pod {key!r}: not a pod name"
        if pod["netns"] != f"{NETNS_PREFIX}{key}":
            return f"pod {key}: netns {pod['netns']!r} is not {NETNS_PREFIX}{key}"
        index = next((i for i in range(data["next_index"]) if pod["veth"] == veth_name(name, i)), None)
        if index is None or index in indexes:
            return f"pod {key}: veth {pod['veth']!r} is not one this sandbox gave out"
        indexes.add(index)
        if pod["ip"] != str(hosts[index + 1]):
            return f"pod {key}: ip {pod['ip']!r} is not {hosts[index + 1]}"
        if not isinstance(pod["meta"], dict):
            return f"pod {key}: meta must be an object"
        if pod["pid"] is not None and not (_whole(pod["pid"], 1) and _whole(pod["pid_start"], 0)):
            return f"pod {key}: pid/pid_start are not a process"
    return None


def state_dir_problem(state_dir: Path) -> str | None:
    """Why root may not keep records in ``state_dir`` (None when it may): it must be a real
    directory of root's with no group or other permission bits, under directories only root can
    change (root or sticky), so no other user can plant, swap or edit a record."""
    try:
        info = os.lstat(state_dir)
    except FileNotFoundError:
        return "does not exist"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return "is not a directory (a symbolic link or a file)"
    if info.st_uid != 0:
        return f"is owned by uid {info.st_uid}, not root"
    if info.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(info.st_mode):04o}: other users may read or change it (it must be 0700)"
    for parent in Path(os.path.abspath(state_dir)).parents:
        info = os.lstat(parent)
        writable = info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX
        if stat.S_ISLNK(info.st_mode) or info.st_uid != 0 or writable:
            return f"is inside {parent}, which a user other than root can change (make it root's, 0755)"
    return None


def prepare_state_dir(state_dir: Path) -> None:
    """Create ``state_dir`` root's with mode 0700 when it is absent; refuse one that is not so,
    before anything is created, naming the directory and the fix."""
    if not os.path.lexists(state_dir):
        state_dir.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileExistsError):  # another job made it first: checked below
            os.mkdir(state_dir, 0o700)
    problem = state_dir_problem(state_dir)
    if problem:
        raise BackendUnavailable(
            f"the local state directory {state_dir} {problem}; root acts on the records kept there, so it must "
            f"be root's alone: run `chown root:root {state_dir} && chmod 0700 {state_dir}`, or set state_dir to a "
            f"directory that does not exist yet (it is then created so), e.g. the default {DEFAULT_STATE_DIR}"
        )
