"""The namespace runner: "pods" as namespaced process trees on this machine.

A sandbox is one bridge and one /24 with pods on it. A pod is what a container is on Kubernetes,
minus the image: the host's files seen through
 - a network namespace with its own IP on the sandbox's bridge,
 - a UTS namespace whose host name is the pod name,
 - a PID namespace: killing its first process ends everything in the pod,
 - a mount namespace with the pod's mounts (binds of host paths, private tmpfs),
 - ``/etc/hosts`` (``ip netns exec`` binds ``/etc/netns/<ns>/hosts``) naming the other pods,
 - optionally a non-root user: the pod's command runs as that uid/gid with no capabilities and
   ``no_new_privs`` (what ``runAsUser``, ``capabilities: drop [ALL]`` and
   ``allowPrivilegeEscalation: false`` give a container).

Used by the local backend (one sandbox per job) and by the Kubernetes API double's kubelet
(one sandbox for the whole double). Every sandbox is recorded in ``<state_dir>/<name>/
sandbox.json`` before anything is created, so a sandbox whose owner died is swept later.

Root acts on these records (deletes the namespaces, links and directories they name, kills the
processes they name), so nothing in one is trusted: the state directory must be root's alone
(``prepare_state_dir``), a record is checked against the rules that made it before it is used
(``Sandbox.load``), and a recorded PID is killed only while it is still the pod's first process
(``processes.is_pod_process``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from airflow_mpi.backends.processes import (
    child_pids,
    host_networks,
    is_pod_process,
    kill_all,
    kill_group,
    link_exists,
    netns_exists,
    pids_in_netns,
    run_ip,
    start_ticks,
    stop_pod_init,
    wait_gone,
)
from airflow_mpi.backends.sandbox_state import (
    NETNS_HOSTS_DIR,
    NETNS_PREFIX,
    RECORD,
    SUBNET_POOL,
    bridge_name,
    free_pod_index,
    name_problem,
    prepare_state_dir,
    record_problem,
    veth_name,
)
from airflow_mpi.exceptions import LaunchError

log = logging.getLogger(__name__)

# PID 1 of every pod, after `ip netns exec` (network, hosts file) and `unshare` (uts, pid, mount).
# Arguments only, never interpolated: the pod name, then "--tmpfs TARGET OPTIONS" and
# "--bind SOURCE TARGET ro|rw" groups in order, optionally "--user UID GID", then "--" and the
# command. With a user, the command runs as it with no capabilities (bounding set emptied) and
# no_new_privs (setuid binaries cannot raise privileges) and no supplementary groups (none of the
# host's groups the user is in, e.g. docker or disk): the mounts are made as root first.
POD_INIT = r"""
set -euo pipefail
printf '%s' "$1" >/proc/sys/kernel/hostname
shift
user=()
while (($#)); do
  case "$1" in
    --tmpfs) mount -t tmpfs -o "$3" tmpfs "$2"; shift 3 ;;
    --bind)
      mount --bind "$2" "$3"
      if [[ "$4" == ro ]]; then mount -o remount,bind,ro "$3"; fi
      shift 4 ;;
    --user) user=("$2" "$3"); shift 3 ;;
    --) shift; break ;;
    *) echo "pod-init: bad argument $1" >&2; exit 2 ;;
  esac
done
cd /
if ((${#user[@]})); then
  exec setpriv --reuid "${user[0]}" --regid "${user[1]}" --clear-groups --no-new-privs \
    --inh-caps=-all --bounding-set=-all -- "$@"
fi
exec "$@"
"""


@dataclass(frozen=True)
class Mount:
    """A bind of a host path (``source``) or, without one, a private tmpfs at ``target``."""

    target: str
    source: str | None = None
    read_only: bool = False
    tmpfs_size: str = "64m"
    tmpfs_mode: str = "0755"
    tmpfs_owner: tuple[int, int] | None = None  # (uid, gid) of the tmpfs's root; default root

    def pod_init_args(self) -> list[str]:
        if self.source is None:
            options = f"mode={self.tmpfs_mode},size={self.tmpfs_size}"
            if self.tmpfs_owner is not None:
                options += f",uid={self.tmpfs_owner[0]},gid={self.tmpfs_owner[1]}"
            return ["--tmpfs", self.target, options]
        return ["--bind", self.source, self.target, "ro" if self.read_only else "rw"]


def render_hosts(entries: Sequence[tuple[str, Sequence[str]]]) -> str:
    """A pod's /etc/hosts: localhost, then each (ip, names). An IPv4 address is named a second
    time as IPv4-mapped IPv6 (``::ffff:10.244.0.2``): a dual-stack socket, such as torch's
    TCPStore (the rendezvous of torch.distributed), holds the peers' addresses in that form, and
    the C library resolves a mapped address only from a line that spells it so; without it each
    rank's lookup goes to a DNS server the pod cannot reach and c10d warns "The hostname of the
    client socket cannot be retrieved". The IPv4 line comes first, so a lookup of a name still
    gives the IPv4 address first (ssh, Open MPI and gloo connect to it as before)."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    for ip, names in entries:
        lines.append(f"{ip} {' '.join(names)}")
    for ip, names in entries:
        if isinstance(ipaddress.ip_address(ip), ipaddress.IPv4Address):
            lines.append(f"::ffff:{ip} {' '.join(names)}")
    return "\n".join(lines) + "\n"


@dataclass
class SandboxPod:
    name: str
    netns: str
    veth: str
    ip: str
    meta: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None
    pid_start: int | None = None


@dataclass
class Sandbox:
    name: str
    dir: Path
    subnet: str
    bridge: str
    owner_pid: int
    owner_start: int
    pods: dict[str, SandboxPod] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    next_index: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    # Pods may be added and started from several threads (the API double's kubelet does).
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    # --- lifecycle ------------------------------------------------------------------------

    @classmethod
    def create(
        cls, state_dir: Path, name: str, meta: dict[str, Any] | None = None, *, host_on_bridge: bool = True
    ) -> Sandbox:
        """Allocate a free /24 and names, record them, then create the bridge. With
        ``host_on_bridge`` the host has the subnet's first address on it (it reaches the pods,
        and they reach it); without, the bridge has no address at all (no IPv4, no IPv6 link-local)
        and answers no ARP, so the pods reach each other and nothing of the host through it."""
        problem = name_problem(name)
        if problem:
            raise LaunchError(f"sandbox name {name!r} {problem}")
        prepare_state_dir(state_dir)
        digest = hashlib.sha256(name.encode()).hexdigest()
        with state_lock(state_dir):
            used = {s.subnet for s in records(state_dir)} | host_networks()
            subnets = list(SUBNET_POOL.subnets(new_prefix=24))
            start = int(digest[:8], 16) % len(subnets)
            subnet = next(
                (
                    s
                    for s in subnets[start:] + subnets[:start]
                    if not any(s.overlaps(ipaddress.ip_network(u)) for u in used)
                ),
                None,
            )
            if subnet is None:
                raise LaunchError(f"no free /24 left in {SUBNET_POOL} for local pods")
            sandbox = cls(
                name=name,
                dir=state_dir / name,
                subnet=str(subnet),
                bridge=bridge_name(name),
                owner_pid=os.getpid(),
                owner_start=start_ticks(os.getpid()) or 0,
                meta=dict(meta or {}),
            )
            # The directory appears with its record in it, or not at all (rename is atomic).
            staging = sandbox.dir.with_name(f".{name}.new")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(mode=0o700)
            (staging / RECORD).write_text(json.dumps(sandbox.record()))
            staging.rename(sandbox.dir)
        try:
            gateway = next(iter(subnet.hosts()))
            bridge = sandbox.bridge
            address = (
                f"addr add {gateway}/{subnet.prefixlen} dev {bridge}"
                if host_on_bridge
                else f"link set dev {bridge} addrgenmode none"
            )
            run_ip(["-batch", "-"], f"link add {bridge} type bridge\n{address}\n")
            if not host_on_bridge:  # not even for the host's other addresses (a root pod can route)
                Path(f"/proc/sys/net/ipv4/conf/{bridge}/arp_ignore").write_text("8\n")
            run_ip(["link", "set", bridge, "up"], "")
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    @classmethod
    def load(cls, state_dir: Path, name: str) -> Sandbox | None:
        """The sandbox recorded as ``name``, or None when there is none. Raises ``LaunchError``
        for a record that breaks the rules its names were made by (it is left as it is)."""
        if name_problem(name):
            return None  # no sandbox can have this name (e.g. a path)
        path = state_dir / name
        try:
            data = json.loads((path / RECORD).read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ValueError:
            shutil.rmtree(path, ignore_errors=True)  # cut short by a crash
            return None
        problem = record_problem(data, name)
        if problem:
            raise LaunchError(
                f"the sandbox record {path / RECORD} is not one this backend wrote ({problem}): nothing it names "
                f"was touched; remove {path} by hand once you know what made it"
            )
        pods = {n: SandboxPod(**p) for n, p in data.pop("pods").items()}
        return cls(dir=path, pods=pods, **data)

    def record(self) -> dict[str, Any]:
        with self._lock:
            return self._fields()

    def _fields(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "subnet": self.subnet,
            "bridge": self.bridge,
            "owner_pid": self.owner_pid,
            "owner_start": self.owner_start,
            "meta": self.meta,
            "next_index": self.next_index,
            "pods": {name: asdict(pod) for name, pod in self.pods.items()},
        }

    def save(self) -> None:
        with self._lock:
            tmp = self.dir / f"{RECORD}.tmp"
            tmp.write_text(json.dumps(self.record()))
            tmp.replace(self.dir / RECORD)

    @property
    def owner_alive(self) -> bool:
        return start_ticks(self.owner_pid) == self.owner_start

    # --- pods -----------------------------------------------------------------------------

    def add_pods(self, names: Sequence[str], meta: dict[str, dict[str, Any]] | None = None) -> list[SandboxPod]:
        """Give each pod a network namespace with an IP on the bridge (recorded first)."""
        network = ipaddress.ip_network(self.subnet)
        hosts = list(network.hosts())
        added = []
        bad = [f"{name!r} {name_problem(name)}" for name in names if name_problem(name)]
        if bad:
            raise LaunchError(f"pod names in sandbox {self.name}: {'; '.join(bad)}")
        with self._lock:
            for name in names:
                fresh = self.next_index + 1 < len(hosts)  # else every address was handed out once
                index = self.next_index if fresh else free_pod_index(self.name, hosts, self.pods.values(), link_exists)
                self.next_index += fresh
                pod = SandboxPod(
                    name=name,
                    netns=f"{NETNS_PREFIX}{name}",
                    veth=veth_name(self.name, index),
                    ip=str(hosts[index + 1]),  # .1 is the bridge
                    meta=(meta or {}).get(name, {}),
                )
                self.pods[name] = pod
                added.append(pod)
            self.save()
        host_side = []
        for pod in added:
            (NETNS_HOSTS_DIR / pod.netns).mkdir(parents=True, exist_ok=True)
            (NETNS_HOSTS_DIR / pod.netns / "hosts").touch()
            host_side += [
                f"netns add {pod.netns}",
                f"link add {pod.veth} type veth peer name eth0 netns {pod.netns}",
                f"link set {pod.veth} master {self.bridge} up",
            ]
        run_ip(["-batch", "-"], "\n".join(host_side) + "\n")
        for pod in added:
            inside = f"addr add {pod.ip}/{network.prefixlen} dev eth0\nlink set eth0 up\nlink set lo up\n"
            run_ip(["-n", pod.netns, "-batch", "-"], inside)
        return added

    def write_hosts(self, entries: Sequence[tuple[str, Sequence[str]]]) -> None:
        """Every pod's /etc/hosts: localhost plus ``entries`` (ip, names). Written in place, so
        running pods, which see the file through a bind mount, see the change."""
        text = render_hosts(entries)
        for pod in self.pods.values():
            path = NETNS_HOSTS_DIR / pod.netns / "hosts"
            with contextlib.suppress(FileNotFoundError), path.open("r+") as handle:
                handle.write(text)
                handle.truncate()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        mounts: Sequence[Mount],
        stdout: IO[bytes] | int,
        user: tuple[int, int] | None = None,
        hostname: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start the pod's first process: ``argv`` with exactly ``env``, behind ``mounts``, as
        ``user`` (uid, gid) without capabilities, or as root. ``hostname``: the pod's own, when
        it is not its name (a pod spec's ``hostname``)."""
        pod = self.pods[name]
        as_user = ["--user", str(user[0]), str(user[1])] if user is not None else []
        command = [
            "ip", "netns", "exec", pod.netns,
            # The pod dies with this process, even SIGKILLed (then unshare's --kill-child).
            "setpriv", "--pdeathsig", "KILL",
            "unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
            "bash", "-c", POD_INIT, "pod-init", hostname or name,
            *(arg for mount in mounts for arg in mount.pod_init_args()),
            *as_user,
            "--", *argv,
        ]  # fmt: skip
        proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )
        with self._lock:
            self.procs[name] = proc
            pod.pid, pod.pid_start = proc.pid, start_ticks(proc.pid)
            self.save()
        return proc

    def exit_code(self, name: str) -> int | None:
        """None while the pod runs; its exit code (negative: signal) once it ended."""
        proc = self.procs.get(name)
        if proc is not None:
            return proc.poll()
        if self._running(self.pods[name]):
            return None
        return -signal.SIGKILL  # started by another process that is gone: cannot know

    @staticmethod
    def _running(pod: SandboxPod) -> bool:
        """The pod's recorded first process still runs (and is that process, not a reused PID)."""
        return pod.pid is not None and is_pod_process(pod.pid, pod.pid_start, pod.netns)

    def names(self) -> set[str]:
        """Every namespace and link this sandbox names (two records never share one)."""
        return {self.bridge, *(n for p in self.pods.values() for n in (p.netns, p.veth))}

    def started(self, name: str) -> bool:
        return self.pods[name].pid is not None

    def run_in(self, name: str, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as root inside the running pod ``name``: its network, hostname, mounts
        and PID namespace (what ``kubectl exec`` is to a container). Raises ``LaunchError``
        when the pod does not run."""
        pod = self.pods[name]
        init = child_pids(pod.pid)[:1] if pod.pid is not None and self._running(pod) else []
        if not init:
            raise LaunchError(f"pod {name} is not running")
        command = ["nsenter", f"--target={init[0]}", "--net", "--uts", "--mount", "--pid", "--", *argv]
        return subprocess.run(
            command, capture_output=True, text=True, errors="replace", timeout=timeout, check=False,
            stdin=subprocess.DEVNULL, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )  # fmt: skip

    def stop(self, name: str) -> None:
        """Kill the pod and everything in it, and wait until it is gone."""
        pod = self.pods[name]
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop_pod_init(proc.pid)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        elif pod.pid is not None and self._running(pod):
            stop_pod_init(pod.pid)
            wait_gone(pod.pid, pod.pid_start, timeout=10)
            if self._running(pod):
                kill_group(pod.pid)
        # Anything still inside the pod's network namespace: e.g. a pod whose owner was killed
        # while it was starting, before its parent-death signal was armed.
        kill_all(pids_in_netns([pod.netns]))

    def remove_pod(self, name: str) -> None:
        self.stop(name)
        with self._lock:
            pod = self.pods.pop(name)
        commands = [f"link del {pod.veth}"] if link_exists(pod.veth) else []
        commands += [f"netns del {pod.netns}"] if netns_exists(pod.netns) else []
        if commands:
            run_ip(["-force", "-batch", "-"], "\n".join(commands) + "\n", check=False)
        shutil.rmtree(NETNS_HOSTS_DIR / pod.netns, ignore_errors=True)
        with self._lock:
            self.save()

    def destroy(self) -> None:
        """Every pod, namespace, link, hosts file and the state directory. Idempotent."""
        for name in list(self.pods):
            self.stop(name)
        # Delete the veths ourselves: once a namespace is gone the kernel frees its veth pair
        # asynchronously, and the host side would linger for a moment.
        commands = [f"link del {p.veth}" for p in self.pods.values() if link_exists(p.veth)]
        commands += [f"netns del {p.netns}" for p in self.pods.values() if netns_exists(p.netns)]
        if link_exists(self.bridge):
            commands.append(f"link del {self.bridge}")
        if commands:
            # -force: go on past a missing object; leftovers() checks every one anyway.
            run_ip(["-force", "-batch", "-"], "\n".join(commands) + "\n", check=False)
        for pod in self.pods.values():
            shutil.rmtree(NETNS_HOSTS_DIR / pod.netns, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        found = [f"state directory {self.dir}"] if self.dir.exists() else []
        found += [f"network namespace {p.netns}" for p in self.pods.values() if netns_exists(p.netns)]
        links = (self.bridge, *(p.veth for p in self.pods.values()))
        found += [f"link {name}" for name in links if link_exists(name)]
        found += [f"process {p.pid} of pod {p.name}" for p in self.pods.values() if self._running(p)]
        found += [f"process {pid} in a pod's network" for pid in pids_in_netns([p.netns for p in self.pods.values()])]
        found += [
            f"hosts directory {NETNS_HOSTS_DIR / p.netns}"
            for p in self.pods.values()
            if (NETNS_HOSTS_DIR / p.netns).exists()
        ]
        return found


# --- records and sweeping ---------------------------------------------------------------------


def records(state_dir: Path) -> list[Sandbox]:
    """Every valid record in ``state_dir``; one that is not is logged and left alone."""
    if not state_dir.exists():
        return []
    found = []
    for entry in sorted(state_dir.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and not entry.name.startswith("."):
            try:
                sandbox = Sandbox.load(state_dir, entry.name)
            except LaunchError as error:
                log.warning("%s", error)
                continue
            if sandbox is not None:
                found.append(sandbox)
    return found


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    with (state_dir / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
