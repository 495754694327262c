"""The embedded local backend: every pod of a plan is a process tree in its own namespaces.

A pod here is what a container is on Kubernetes, minus the image: the host's files, seen through
 - a network namespace with its own IP on a bridge the job owns (sshd on the real port),
 - a UTS namespace whose host name is the pod name (DeepSpeed and gloo tell nodes apart by it),
 - a PID namespace: killing its first process ends everything in the pod, orted included,
 - a mount namespace with the pod's files at the pod paths (``/etc/mpi``, the ssh Secret dir),
   a private ``/tmp`` (Open MPI's session dir) and private ``/run/airflow-mpi`` and ``/run/sshd``,
 - ``/etc/hosts`` (via ``ip netns exec``) naming every pod ``<pod>.<job>``.
Every pod runs the same launch script with the same env as on Kubernetes.

State lives in ``<state_dir>/<job>/`` with a ``job.json`` written before anything is created,
so the next start of any job sweeps what a crashed owner left behind. Several jobs at once get
separate names, bridges and /24 subnets (allocated under a file lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_mpi import contract
from airflow_mpi.exceptions import BackendUnavailable, LaunchError, SpecError, SpecIssue
from airflow_mpi.plan import JobPlan
from airflow_mpi.readiness import HostProbe, HostProblem, classify_ssh_result
from airflow_mpi.spec import Role
from airflow_mpi.ssh import KEY_DIR_MODE, KEY_FILE_MODE, build_ssh_probe_argv
from airflow_mpi.status import PodPhase, PodState

DEFAULT_STATE_DIR = Path("/run/airflow-mpi-local")
SUBNET_POOL = ipaddress.IPv4Network("10.244.0.0/16")
NETNS_PREFIX = "ampl-"
BRIDGE_PREFIX = "ampb"
VETH_PREFIX = "ampv"
NETNS_HOSTS_DIR = Path("/etc/netns")
REQUIRED_TOOLS = ("ip", "unshare", "setpriv", "mount", "ssh", "mpiexec", "bash")
SSHD = "/usr/sbin/sshd"
MAX_PODS = 253  # one /24 per job
READ_CHUNK = 1 << 20
MAX_LINE = 1 << 20  # a "line" longer than this is cut, so memory stays bounded

# PID 1 of every pod, after `ip netns exec` (net + hosts file) and `unshare` (uts, pid, mount).
# Arguments only, no interpolation: pod, config src/dst, ssh src/dst, runtime dir, then
# "src dst ro" triples for the user's volumes.
POD_INIT = r"""
set -euo pipefail
pod="$1" config_src="$2" config_dst="$3" ssh_src="$4" ssh_dst="$5" runtime_dir="$6"
shift 6
printf '%s' "$pod" >/proc/sys/kernel/hostname
mount --bind "$config_src" "$config_dst"
mount -o remount,bind,ro "$config_dst"
mount --bind "$ssh_src" "$ssh_dst"
mount -o remount,bind,ro "$ssh_dst"
mount -t tmpfs -o mode=1777,size=50% tmpfs /tmp
mount -t tmpfs -o mode=0755,size=16m tmpfs "$runtime_dir"
mount -t tmpfs -o mode=0755,size=1m tmpfs /run/sshd
while (($# >= 3)); do
  mount --bind "$1" "$2"
  if [[ "$3" == 1 ]]; then mount -o remount,bind,ro "$2"; fi
  shift 3
done
cd /
exec bash "$config_dst/launch.sh"
"""


def check_prerequisites() -> list[str]:
    """What this machine lacks to run the local backend (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root (network, PID and mount namespaces need it): run as root")
    for tool in REQUIRED_TOOLS:
        if shutil.which(tool) is None:
            package = {"ip": "iproute2", "ssh": "openssh-client", "mpiexec": "openmpi-bin"}.get(tool, "util-linux")
            problems.append(f"'{tool}' (apt-get install {package})")
    if not Path(SSHD).exists():
        problems.append(f"{SSHD} (apt-get install openssh-server)")
    return problems


@dataclass
class _Pod:
    name: str
    role: Role
    netns: str
    veth: str
    ip: str
    pid: int | None = None
    pid_start: int | None = None


@dataclass
class _Job:
    """What the backend knows of one job; ``job.json`` holds everything but the processes."""

    name: str
    dir: Path
    subnet: str
    bridge: str
    ssh_port: int
    pods: dict[str, _Pod]
    owner_pid: int
    owner_start: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    mounts: dict[str, list[str]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {
            "job": self.name,
            "subnet": self.subnet,
            "bridge": self.bridge,
            "ssh_port": self.ssh_port,
            "owner_pid": self.owner_pid,
            "owner_start": self.owner_start,
            "pods": {p.name: {**p.__dict__, "role": p.role.value} for p in self.pods.values()},
        }

    @classmethod
    def from_record(cls, path: Path, data: dict[str, Any]) -> _Job:
        pods = {name: _Pod(**{**p, "role": Role(p["role"])}) for name, p in data["pods"].items()}
        return cls(
            name=data["job"],
            dir=path,
            subnet=data["subnet"],
            bridge=data["bridge"],
            ssh_port=data["ssh_port"],
            pods=pods,
            owner_pid=data["owner_pid"],
            owner_start=data["owner_start"],
        )

    @property
    def master(self) -> _Pod:
        return next(p for p in self.pods.values() if p.role is Role.MASTER)

    @property
    def workers(self) -> list[_Pod]:
        return [p for p in self.pods.values() if p.role is Role.WORKER]

    def log_path(self, pod: str) -> Path:
        return self.dir / "logs" / f"{pod}.log"

    def ssh_dir(self, pod: str) -> Path:
        return self.dir / "pods" / pod / "ssh"


class LocalBackend:
    """Runs a plan's pods on this machine (root, iproute2, util-linux, openssh, Open MPI)."""

    name = "local"

    def __init__(self, state_dir: str | Path | None = None, path: str | None = None) -> None:
        self.state_dir = Path(state_dir) if state_dir else DEFAULT_STATE_DIR
        # The PATH pods see: this interpreter's directory first, so ranks run the same Python
        # (and packages) as Airflow, then this process's PATH.
        self.path = path or os.pathsep.join(
            [os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")]
        )
        self._jobs: dict[str, _Job] = {}

    # --- create ---------------------------------------------------------------------------

    def create(self, plan: JobPlan) -> None:
        problems = check_prerequisites()
        if problems:
            raise BackendUnavailable("the local backend cannot run here; missing: " + "; ".join(problems))
        self._check_supported(plan)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.sweep()
        self.teardown(plan.job_name)  # an earlier attempt of this very job
        job = self._allocate(plan)
        try:
            self._write_files(job, plan)
            self._create_network(job)
            for worker in job.workers:
                self._start_pod(job, worker)
        except BaseException as error:
            self.teardown(job.name)
            if isinstance(error, subprocess.SubprocessError | OSError):
                raise LaunchError(f"local backend could not create job {job.name}: {error}") from error
            raise

    def _check_supported(self, plan: JobPlan) -> None:
        issues = []
        if len(plan.pods) > MAX_PODS:
            issues.append(
                SpecIssue(
                    "workers.replicas", f"{len(plan.pods)} pods exceed the local backend's {MAX_PODS}", "use fewer"
                )
            )
        for index, volume in enumerate(plan.spec.pod.volumes):
            path = f"pod.volumes[{index}]"
            if not (volume.host_path or volume.empty_dir):
                issues.append(
                    SpecIssue(
                        path, f"{volume.sources[0]} volumes need Kubernetes", "use host_path or empty_dir locally"
                    )
                )
            if volume.host_path and _under(volume.host_path, ("/tmp", plan.paths.runtime_dir, "/run/sshd")):
                issues.append(
                    SpecIssue(
                        f"{path}.host_path",
                        "is under /tmp or /run/sshd, which every local pod gets privately",
                        "share data from another directory, e.g. /var/tmp/...",
                    )
                )
        if issues:
            raise SpecError(issues)

    def _allocate(self, plan: JobPlan) -> _Job:
        """Pick a free /24 and names, and record the job before creating anything."""
        digest = hashlib.sha256(plan.job_name.encode()).hexdigest()
        with self._lock():
            used = {job.subnet for job in self._records()} | _host_networks()
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
                raise LaunchError(f"no free /24 left in {SUBNET_POOL} for the local backend")
            hosts = list(subnet.hosts())
            pods = {
                pod.name: _Pod(
                    name=pod.name,
                    role=pod.role,
                    netns=f"{NETNS_PREFIX}{pod.name}",
                    veth=f"{VETH_PREFIX}{digest[:6]}x{i}",
                    ip=str(hosts[i + 1]),  # .1 is the bridge
                )
                for i, pod in enumerate(plan.pods)
            }
            job = _Job(
                name=plan.job_name,
                dir=self.state_dir / plan.job_name,
                subnet=str(subnet),
                bridge=f"{BRIDGE_PREFIX}{digest[:8]}",
                ssh_port=plan.spec.ssh_port,
                pods=pods,
                owner_pid=os.getpid(),
                owner_start=_start_ticks(os.getpid()) or 0,
            )
            # The directory appears with its record in it, or not at all (rename is atomic).
            staging = job.dir.with_name(f".{job.name}.new")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(mode=0o700)
            (staging / "job.json").write_text(json.dumps(job.record(), indent=1))
            staging.rename(job.dir)
        self._jobs[job.name] = job
        return job

    def _write_files(self, job: _Job, plan: JobPlan) -> None:
        config = job.dir / "config"
        config.mkdir(mode=0o755)
        for name, text in plan.config_files.items():
            (config / name).write_text(text)
        (config / contract.CONFIG_LAUNCH).chmod(0o755)
        (job.dir / "logs").mkdir(mode=0o700)
        hosts = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n" + "".join(
            f"{pod.ip} {pod.name}.{job.name} {pod.name}\n" for pod in job.pods.values()
        )
        for pod in job.pods.values():
            ssh_dir = job.ssh_dir(pod.name)
            ssh_dir.mkdir(parents=True, mode=KEY_DIR_MODE)
            for name, text in plan.ssh_files_for(pod.name).items():
                target = ssh_dir / name
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
                with os.fdopen(fd, "w") as handle:
                    handle.write(text)
            netns_dir = NETNS_HOSTS_DIR / pod.netns
            netns_dir.mkdir(parents=True, exist_ok=True)
            (netns_dir / "hosts").write_text(hosts)
            job.envs[pod.name] = {**self._base_env(), **plan.pod(pod.name).env}
            job.mounts[pod.name] = self._volume_args(job, plan, pod.name)
        for path in (plan.paths.config_dir, plan.paths.ssh_secret_dir, plan.paths.runtime_dir, "/run/sshd"):
            Path(path).mkdir(parents=True, exist_ok=True)  # mount points (the image has them)

    def _volume_args(self, job: _Job, plan: JobPlan, pod: str) -> list[str]:
        args: list[str] = []
        for volume in plan.spec.pod.volumes:
            if volume.host_path:
                source = Path(volume.host_path)
                if volume.sub_path:
                    source = source / volume.sub_path
                if not source.exists():
                    raise LaunchError(f"volume {volume.name}: host_path {source} does not exist")
            else:
                source = job.dir / "pods" / pod / "volumes" / volume.name
                source.mkdir(parents=True)
            if source == Path(volume.mount_path) and not volume.read_only:
                continue  # already seen at the same path
            Path(volume.mount_path).mkdir(parents=True, exist_ok=True)
            args += [str(source), volume.mount_path, "1" if volume.read_only else "0"]
        return args

    def _base_env(self) -> dict[str, str]:
        """A container-like environment: not the Airflow worker's."""
        return {"PATH": self.path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "USER": "root"}

    def _create_network(self, job: _Job) -> None:
        subnet = ipaddress.ip_network(job.subnet)
        gateway = next(iter(subnet.hosts()))
        host_side = [
            f"link add {job.bridge} type bridge",
            f"addr add {gateway}/{subnet.prefixlen} dev {job.bridge}",
            f"link set {job.bridge} up",
        ]
        for pod in job.pods.values():
            host_side += [
                f"netns add {pod.netns}",
                f"link add {pod.veth} type veth peer name eth0 netns {pod.netns}",
                f"link set {pod.veth} master {job.bridge} up",
            ]
        _ip(["-batch", "-"], "\n".join(host_side) + "\n")
        for pod in job.pods.values():
            inside = f"addr add {pod.ip}/{subnet.prefixlen} dev eth0\nlink set eth0 up\nlink set lo up\n"
            _ip(["-n", pod.netns, "-batch", "-"], inside)

    def _start_pod(self, job: _Job, pod: _Pod, *, pipe_output: bool = False) -> None:
        paths = contract.DEFAULT_PATHS
        argv = [
            "ip", "netns", "exec", pod.netns,
            # The pod dies with this process, even if it is SIGKILLed (then unshare's --kill-child).
            "setpriv", "--pdeathsig", "KILL",
            "unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
            "bash", "-c", POD_INIT, "pod-init", pod.name,
            str(job.dir / "config"), paths.config_dir,
            str(job.ssh_dir(pod.name)), paths.ssh_secret_dir,
            paths.runtime_dir,
            *job.mounts[pod.name],
        ]  # fmt: skip
        log = job.log_path(pod.name).open("ab")
        try:
            proc = subprocess.Popen(
                argv,
                env=job.envs[pod.name],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipe_output else log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",
            )
        finally:
            log.close()
        job.procs[pod.name] = proc
        pod.pid, pod.pid_start = proc.pid, _start_ticks(proc.pid)
        self._save(job)

    # --- readiness, master, output --------------------------------------------------------

    def probe_workers(self, job_name: str) -> list[HostProbe]:
        job = self._job(job_name)
        master = job.master
        master_ssh = job.ssh_dir(master.name)

        def probe(pod: _Pod) -> HostProbe:
            host = f"{pod.name}.{job.name}"
            if self._pod_ended(job, pod):
                tail = " | ".join(self.pod_log_tail(job_name, pod.name, 3))
                return HostProbe(host, HostProblem.POD_ENDED, tail)
            argv = build_ssh_probe_argv(
                host,
                job.ssh_port,
                str(master_ssh / contract.SSH_CLIENT_KEY),
                str(master_ssh / contract.SSH_KNOWN_HOSTS),
                connect_timeout=2,
            )
            # From the master's network namespace: its hosts file, its routes, like mpiexec.
            done = subprocess.run(
                ["ip", "netns", "exec", master.netns, *argv],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            return classify_ssh_result(host, done.returncode, done.stderr)

        workers = job.workers
        if not workers:
            return []
        with ThreadPoolExecutor(max_workers=min(32, len(workers))) as pool:
            return list(pool.map(probe, workers))

    def start_master(self, job_name: str) -> None:
        job = self._job(job_name)
        self._start_pod(job, job.master, pipe_output=True)

    def follow_master(self, job_name: str, idle_tick: float = 0.1) -> Iterator[list[str]]:
        job = self._job(job_name)
        proc = job.procs[job.master.name]
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        partial = b""
        with job.log_path(job.master.name).open("ab") as log:
            while True:
                ready, _, _ = select.select([fd], [], [], idle_tick)
                if not ready:
                    yield []
                    continue
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                log.write(chunk)
                pieces = (partial + chunk).split(b"\n")
                partial = pieces.pop()
                if len(partial) > MAX_LINE:
                    pieces.append(partial)
                    partial = b""
                yield [piece.decode("utf-8", "replace").rstrip("\r") for piece in pieces]
        if partial:
            yield [partial.decode("utf-8", "replace").rstrip("\r")]
        proc.wait()

    # --- state ----------------------------------------------------------------------------

    def pod_states(self, job_name: str) -> list[PodState]:
        job = self._job(job_name)
        states = []
        for pod in job.pods.values():
            proc = job.procs.get(pod.name)
            if proc is not None:
                code = proc.poll()
                if code is None:
                    states.append(PodState(pod.name, pod.role, PodPhase.RUNNING, ready=pod.role is Role.WORKER))
                else:
                    phase = PodPhase.SUCCEEDED if code == 0 else PodPhase.FAILED
                    reason = f"killed by {signal.Signals(-code).name}" if code < 0 else ""
                    states.append(PodState(pod.name, pod.role, phase, exit_code=code, reason=reason))
            elif pod.pid is not None:  # started by another process (a sensor, a later try)
                alive = _start_ticks(pod.pid) == pod.pid_start
                phase = PodPhase.RUNNING if alive else PodPhase.FAILED
                states.append(PodState(pod.name, pod.role, phase, ready=alive and pod.role is Role.WORKER))
            else:
                states.append(PodState(pod.name, pod.role, PodPhase.PENDING))
        return states

    def _pod_ended(self, job: _Job, pod: _Pod) -> bool:
        proc = job.procs.get(pod.name)
        if proc is not None:
            return proc.poll() is not None
        return pod.pid is None or _start_ticks(pod.pid) != pod.pid_start

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        path = self.state_dir / job_name / "logs" / f"{pod}.log"
        try:
            with path.open("rb") as handle:
                handle.seek(max(0, path.stat().st_size - 64 * 1024))
                text = handle.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    # --- teardown -------------------------------------------------------------------------

    def teardown(self, job_name: str) -> None:
        job = self._jobs.pop(job_name, None) or self._load(job_name)
        if job is None:
            return
        self._remove(job)

    def _remove(self, job: _Job) -> None:
        for pod in job.pods.values():
            proc = job.procs.get(pod.name)
            if proc is not None:
                _stop_pod(proc.pid)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)
                    proc.wait(timeout=10)
                if proc.stdout is not None:
                    proc.stdout.close()
            elif pod.pid is not None and _start_ticks(pod.pid) == pod.pid_start:
                _stop_pod(pod.pid)
                _wait_gone(pod.pid, pod.pid_start, timeout=10)
                if _start_ticks(pod.pid) == pod.pid_start:
                    _kill_group(pod.pid)
        # Anything still inside the job's network namespaces: e.g. a pod whose owner was killed
        # while it was starting, before its parent-death signal was armed.
        _kill_all(_pids_in_netns([pod.netns for pod in job.pods.values()]))
        # Delete the veths ourselves: once a namespace is gone the kernel frees its veth pair
        # asynchronously, and the host side would linger for a moment.
        commands = [f"link del {pod.veth}" for pod in job.pods.values() if _link_exists(pod.veth)]
        commands += [f"netns del {pod.netns}" for pod in job.pods.values() if _netns_exists(pod.netns)]
        if _link_exists(job.bridge):
            commands.append(f"link del {job.bridge}")
        if commands:
            # -force: go on past a missing object; every object is checked below anyway.
            _ip(["-force", "-batch", "-"], "\n".join(commands) + "\n", check=False)
        for pod in job.pods.values():
            shutil.rmtree(NETNS_HOSTS_DIR / pod.netns, ignore_errors=True)
        shutil.rmtree(job.dir, ignore_errors=True)

    def leftovers(self, job_name: str) -> list[str]:
        found = []
        job = self._jobs.get(job_name) or self._load(job_name)
        if (self.state_dir / job_name).exists():
            found.append(f"state directory {self.state_dir / job_name}")
        if job is not None:
            found += [f"network namespace {p.netns}" for p in job.pods.values() if _netns_exists(p.netns)]
            found += [
                f"link {name}" for name in (job.bridge, *(p.veth for p in job.pods.values())) if _link_exists(name)
            ]
            found += [
                f"process {p.pid} of pod {p.name}"
                for p in job.pods.values()
                if p.pid is not None and _start_ticks(p.pid) == p.pid_start
            ]
            found += [
                f"process {pid} in the job's network" for pid in _pids_in_netns([p.netns for p in job.pods.values()])
            ]
        prefix = f"{NETNS_PREFIX}{job_name}-"
        found += [f"network namespace {ns}" for ns in _netns_list() if ns.startswith(prefix) and ns not in str(found)]
        found += [f"hosts directory {d}" for d in NETNS_HOSTS_DIR.glob(f"{prefix}*")]
        return found

    def sweep(self) -> list[str]:
        """Remove every job whose owner process is gone (a crashed task or CLI run)."""
        swept = []
        for job in self._records():
            if job.name in self._jobs:
                continue
            if _start_ticks(job.owner_pid) != job.owner_start:
                self._remove(job)
                swept.append(job.name)
        return swept

    def sweep_orphans(self) -> list[str]:
        """Remove namespaces, links and hosts files of ours that no record here describes and no
        process uses (e.g. after the state directory was deleted by hand). Only for an explicit
        clean-up (``airflow-mpi doctor --clean``): another state directory's job that is being
        created right now would look the same."""
        self.sweep()
        known = {p.netns for job in self._records() for p in job.pods.values()}
        known_links = {n for job in self._records() for n in (job.bridge, *(p.veth for p in job.pods.values()))}
        removed = []
        for name in _netns_list():
            if name.startswith(NETNS_PREFIX) and name not in known and not _pids_in_netns([name]):
                _ip(["netns", "del", name], "", check=False)
                removed.append(f"network namespace {name}")
        for link in sorted(os.listdir("/sys/class/net")):
            if link.startswith((BRIDGE_PREFIX, VETH_PREFIX)) and link not in known_links:
                _ip(["link", "del", link], "", check=False)
                removed.append(f"link {link}")
        for hosts in NETNS_HOSTS_DIR.glob(f"{NETNS_PREFIX}*"):
            if hosts.name not in known:
                shutil.rmtree(hosts, ignore_errors=True)
                removed.append(f"hosts directory {hosts}")
        return removed

    # --- records --------------------------------------------------------------------------

    def _job(self, job_name: str) -> _Job:
        job = self._jobs.get(job_name) or self._load(job_name)
        if job is None:
            raise LaunchError(f"no local job {job_name} (never created, or already torn down)")
        return job

    def _load(self, job_name: str) -> _Job | None:
        path = self.state_dir / job_name
        try:
            return _Job.from_record(path, json.loads((path / "job.json").read_text()))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (ValueError, KeyError, TypeError):
            # A record cut short by a crash: remove what its name tells.
            shutil.rmtree(path, ignore_errors=True)
            return None

    def _records(self) -> list[_Job]:
        if not self.state_dir.exists():
            return []
        jobs = []
        for entry in sorted(self.state_dir.iterdir()):
            if entry.is_dir():
                job = self._load(entry.name)
                if job is not None:
                    jobs.append(job)
        return jobs

    def _save(self, job: _Job) -> None:
        tmp = job.dir / "job.json.tmp"
        tmp.write_text(json.dumps(job.record(), indent=1))
        tmp.replace(job.dir / "job.json")

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with (self.state_dir / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


# --- small system helpers ---------------------------------------------------------------------


def _ip(args: list[str], script: str, *, check: bool = True) -> None:
    done = subprocess.run(["ip", *args], input=script, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise LaunchError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def _netns_list() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def _netns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def _host_networks() -> set[str]:
    """IPv4 networks already on this host's interfaces (never allocate over them)."""
    done = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=False)
    networks = set()
    try:
        for link in json.loads(done.stdout or "[]"):
            for addr in link.get("addr_info", []):
                networks.add(str(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False)))
    except (ValueError, KeyError):
        pass
    return networks


def _start_ticks(pid: int) -> int | None:
    """A process's start time (guards against PID reuse); None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _pids_in_netns(names: list[str]) -> list[int]:
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


def _kill_all(pids: list[int], timeout: float = 5) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_start_ticks(pid) is not None for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _stop_pod(unshare_pid: int) -> None:
    """Kill the pod's first process (its PID namespace's init): the kernel then kills and reaps
    everything in the pod, and ``unshare`` exits by itself, so nothing is left as a zombie."""
    children = _children(unshare_pid)
    if not children:
        _kill_group(unshare_pid)
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _wait_gone(pid: int, start: int | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _start_ticks(pid) == start and time.monotonic() < deadline:
        time.sleep(0.02)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    clean = os.path.normpath(path)
    return any(clean == root or clean.startswith(root.rstrip("/") + "/") for root in roots)
