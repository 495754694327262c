"""The namespace runner: "pods" as namespaced process trees on this machine.

A sandbox is one bridge and one /24 with pods on it. The bridge is on the host when the host
must reach the pods (the API double's kubelet), else in a network namespace of its own, where the
host has no part in the pods' network at all and a teardown is only namespace deletions. A pod
is what a container is on Kubernetes, minus the image: the host's files seen through
 - a network namespace with its own IP on the sandbox's bridge; its route to the other pods
   acknowledges at once (``quickack``): with delayed ACKs every ssh login waits twice for 40 ms
   while sshd's split writes sit behind Nagle (0.14 s a login here, 0.05 s without),
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
import functools
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
from airflow_mpi.backends.sandbox_pod import POD_INIT, Mount, render_hosts
from airflow_mpi.backends.sandbox_state import (
    NETNS_HOSTS_DIR,
    NETNS_PREFIX,
    RECORD,
    SUBNET_POOL,
    bridge_name,
    bridge_netns_name,
    free_pod_index,
    name_problem,
    prepare_state_dir,
    record_problem,
    veth_name,
)
from airflow_mpi.exceptions import LaunchError

log = logging.getLogger(__name__)


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
    bridge_netns: str | None  # None: the bridge is on the host
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
        ``host_on_bridge`` the bridge is on the host, which has the subnet's first address on it
        (it reaches the pods, and they reach it); without, the bridge is alone in a namespace of
        its own with no address at all, so the pods reach each other and nothing else."""
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
                bridge_netns=None if host_on_bridge else bridge_netns_name(name),
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
            bridge = sandbox.bridge
            if sandbox.bridge_netns is None:
                gateway = next(iter(subnet.hosts()))
                address = f"addr add {gateway}/{subnet.prefixlen} dev {bridge}"
                run_ip(["-batch", "-"], f"link add {bridge} type bridge\n{address}\nlink set {bridge} up\n")
            else:
                run_ip(["netns", "add", sandbox.bridge_netns], "")
                bridge_up = (
                    f"link add {bridge} type bridge\nlink set dev {bridge} addrgenmode none\nlink set {bridge} up\n"
                )
                run_ip(["-n", sandbox.bridge_netns, "-batch", "-"], bridge_up)
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
            "bridge_netns": self.bridge_netns,
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
        # A removed pod's veth is looked for where the bridge is: the host or its own namespace.
        veth_there = functools.partial(link_exists, netns=self.bridge_netns)
        with self._lock:
            for name in names:
                fresh = self.next_index + 1 < len(hosts)  # else every address was handed out once
                index = self.next_index if fresh else free_pod_index(self.name, hosts, self.pods.values(), veth_there)
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
        host_side, bridge_side = [], []
        # The veth's bridge end is made where the bridge is (``netns``), its other end in the pod.
        bridge_end = f" netns {self.bridge_netns}" if self.bridge_netns else ""
        for pod in added:
            (NETNS_HOSTS_DIR / pod.netns).mkdir(parents=True, exist_ok=True)
            (NETNS_HOSTS_DIR / pod.netns / "hosts").touch()
            host_side += [
                f"netns add {pod.netns}",
                f"link add {pod.veth}{bridge_end} type veth peer name eth0 netns {pod.netns}",
            ]
            bridge_side.append(f"link set {pod.veth} master {self.bridge} up")
        if self.bridge_netns is None:
            run_ip(["-batch", "-"], "\n".join(host_side + bridge_side) + "\n")
        else:
            run_ip(["-batch", "-"], "\n".join(host_side) + "\n")
            run_ip(["-n", self.bridge_netns, "-batch", "-"], "\n".join(bridge_side) + "\n")
        for pod in added:
            inside = (
                f"addr add {pod.ip}/{network.prefixlen} dev eth0 noprefixroute\n"
                "link set eth0 up\nlink set lo up\n"
                f"route add {network} dev eth0 proto kernel scope link src {pod.ip} quickack 1\n"
            )
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
        stdin_pipe: bool = False,
    ) -> subprocess.Popen[bytes]:
        """Start the pod's first process: ``argv`` with exactly ``env``, behind ``mounts``, as
        ``user`` (uid, gid) without capabilities, or as root. ``hostname``: the pod's own, when
        it is not its name (a pod spec's ``hostname``). ``stdin_pipe``: its standard input is a
        pipe from the caller (``Popen.stdin``), else /dev/null."""
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
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
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
        names = {self.bridge, *(n for p in self.pods.values() for n in (p.netns, p.veth))}
        return names | ({self.bridge_netns} if self.bridge_netns else set())

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
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
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
        # In the bridge's own namespace the veth goes with the pod's (out of the host's sight).
        commands = [f"link del {pod.veth}"] if self.bridge_netns is None and link_exists(pod.veth) else []
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
        commands = []
        if self.bridge_netns is None:
            # Delete the veths ourselves: once a namespace is gone the kernel frees its veth pair
            # asynchronously, and the host side would linger for a moment.
            commands += [f"link del {p.veth}" for p in self.pods.values() if link_exists(p.veth)]
        commands += [f"netns del {p.netns}" for p in self.pods.values() if netns_exists(p.netns)]
        if self.bridge_netns is None and link_exists(self.bridge):
            commands.append(f"link del {self.bridge}")
        # The bridge's namespace last: its links go with it, in the kernel's time, out of sight.
        if self.bridge_netns is not None and netns_exists(self.bridge_netns):
            commands.append(f"netns del {self.bridge_netns}")
        if commands:
            # -force: go on past a missing object; leftovers() checks every one anyway.
            run_ip(["-force", "-batch", "-"], "\n".join(commands) + "\n", check=False)
        for pod in self.pods.values():
            shutil.rmtree(NETNS_HOSTS_DIR / pod.netns, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        found = [f"state directory {self.dir}"] if self.dir.exists() else []
        found += [f"network namespace {p.netns}" for p in self.pods.values() if netns_exists(p.netns)]
        if self.bridge_netns is not None and netns_exists(self.bridge_netns):
            found.append(f"network namespace {self.bridge_netns} (the bridge's)")
        links = (self.bridge, *(p.veth for p in self.pods.values())) if self.bridge_netns is None else ()
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
