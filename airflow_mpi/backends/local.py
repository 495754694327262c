"""The embedded local backend: every pod of a plan runs in a sandbox on this machine.

One sandbox (``backends.sandbox``) per job: its own bridge and /24, one namespaced process
tree per pod with the pod's files at the pod paths (``/etc/mpi``, the ssh Secret directory), a
private ``/tmp`` (Open MPI's session directory: daemons sharing one crashed intermittently),
private ``/run/airflow-mpi`` and ``/run/sshd``, and ``/etc/hosts`` naming every ``<pod>.<job>``.
Every pod runs the same launch script with the same env as on Kubernetes. A job with
``pod.run_as_user`` runs every pod as that user of this machine, without capabilities, its ssh
files and runtime directory owned by it (what the image and ``fsGroup`` give it on Kubernetes).

State lives in ``<state_dir>/<job>/`` (a directory of root's alone); the next job to start
sweeps what a crashed owner left. Several jobs at once get separate names, bridges and subnets;
a job never replaces a same-named one that another task owns or whose owner still runs.
Mount points missing on this machine are made for the pods and removed again when the last job
of the state directory that needs them ends.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from airflow_mpi import contract
from airflow_mpi.backends import sandbox as sandboxes
from airflow_mpi.backends.local_checks import build_owner, check_supported, collision_problem
from airflow_mpi.backends.local_checks import check_prerequisites as check_prerequisites
from airflow_mpi.backends.pod_exec import run_in_pods, running_pods
from airflow_mpi.backends.processes import netns_list
from airflow_mpi.backends.sandbox import Sandbox
from airflow_mpi.backends.sandbox_pod import Mount
from airflow_mpi.backends.sandbox_state import DEFAULT_STATE_DIR as DEFAULT_STATE_DIR
from airflow_mpi.backends.sandbox_state import NETNS_HOSTS_DIR, NETNS_PREFIX, bridge_netns_name, prepare_state_dir
from airflow_mpi.backends.sweep import sweep, sweep_orphans
from airflow_mpi.exceptions import BackendUnavailable, JobNotFound, LaunchError
from airflow_mpi.job.naming import build_host_name
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.job.ssh import KEY_DIR_MODE, KEY_FILE_MODE, build_ssh_probe_argv
from airflow_mpi.observe.lines import RankLineSplitter
from airflow_mpi.observe.readiness import HostProbe, HostProblem, classify_ssh_result
from airflow_mpi.observe.stacks import stacks_command
from airflow_mpi.observe.status import PodPhase, PodState
from airflow_mpi.spec import Role

log = logging.getLogger(__name__)
READ_CHUNK = 1 << 20
# The master's log file (in memory, under /run) keeps its last MASTER_LOG_KEEP bytes once it
# passes MASTER_LOG_MAX: it only serves the "last lines" of failure messages.
MASTER_LOG_MAX = 16 << 20
MASTER_LOG_KEEP = 1 << 20
# In the state directory: the mount points jobs of it made on this machine (absent before).
MADE_MOUNT_POINTS = ".mount-points.json"
# How long one readiness probe asks a host whose sshd port is still closed again, 10 ms apart:
# sshd listens within about 0.1 s of its pod's start here.
PORT_CLOSED_RETRY_S = 0.3


def pod_mounts(plan: JobPlan, job_dir: Path, pod: str) -> list[Mount]:
    """Private tmpfs first (container-like /tmp and run dirs), then the pod's files and volumes."""
    paths = plan.paths
    mounts = [
        Mount("/tmp", tmpfs_size="50%", tmpfs_mode="1777"),
        # Owned by the job's user when it runs without root, as the image's directory is.
        Mount(paths.runtime_dir, tmpfs_size="16m", tmpfs_owner=plan.spec.pod.run_as),
        Mount("/run/sshd", tmpfs_size="1m"),
        Mount(paths.config_dir, source=str(job_dir / "config"), read_only=True),
        Mount(paths.ssh_secret_dir, source=str(job_dir / "pods" / pod / "ssh"), read_only=True),
    ]
    for volume in plan.spec.pod.volumes:
        if volume.host_path:
            source = Path(volume.host_path) / (volume.sub_path or "")
        else:
            source = job_dir / "pods" / pod / "volumes" / volume.name
        if source != Path(volume.mount_path) or volume.read_only:  # else: already there
            mounts.append(Mount(volume.mount_path, source=str(source), read_only=volume.read_only))
    return mounts


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
        self._sandboxes: dict[str, Sandbox] = {}
        self._plans: dict[str, JobPlan] = {}
        # The workers that accepted a login from the master's namespace with its key, in the
        # latest probe: when that is all of them, the master need not check them again.
        self._accepted: dict[str, set[str]] = {}

    # --- create ---------------------------------------------------------------------------

    def create(self, plan: JobPlan) -> None:
        problems = check_prerequisites(self.path, self.state_dir)
        if problems:
            raise BackendUnavailable("the local backend cannot run here; missing: " + "; ".join(problems))
        check_supported(plan)
        _warn_about_gpus(plan)
        prepare_state_dir(self.state_dir)
        self._refuse_collision(plan)
        self.sweep()
        self.teardown(plan.job_name)  # an earlier attempt of this very task instance, its owner gone
        job_dir = self.state_dir / plan.job_name
        meta = {
            "ssh_port": plan.spec.ssh_port,
            "ssh_user": _user_name(plan),
            "owner": build_owner(plan),
            # Recorded before they are made: a job ending meanwhile keeps what this one needs.
            "mount_points": sorted({m.target for p in plan.pods for m in pod_mounts(plan, job_dir, p.name)}),
        }
        # Nothing of a job's reaches a pod from the host (probes run in the master's network), so
        # the host has no address on the job's bridge: its services are out of the pods' reach.
        sandbox = Sandbox.create(self.state_dir, plan.job_name, meta=meta, host_on_bridge=False)
        self._sandboxes[plan.job_name] = sandbox
        self._plans[plan.job_name] = plan
        try:
            sandbox.add_pods([p.name for p in plan.pods], meta={p.name: {"role": p.role.value} for p in plan.pods})
            sandbox.write_hosts([(sandbox.pods[p.name].ip, (p.host, p.name)) for p in plan.pods])
            self._write_files(sandbox, plan)
            for worker in plan.workers:
                self._start_pod(sandbox, plan, worker.name, pipe_output=False)
            # The master too, behind its start gate: its own sshd, names and launcher check run
            # while the workers' sshd start, and mpiexec waits for start_master's word.
            gate = {contract.ENV_START_GATE: "stdin"}
            self._start_pod(sandbox, plan, plan.master.name, pipe_output=True, extra_env=gate)
        except BaseException as error:
            self.teardown(plan.job_name)
            if isinstance(error, subprocess.SubprocessError | OSError):
                raise LaunchError(f"local backend could not create job {plan.job_name}: {error}") from error
            raise

    def _write_files(self, sandbox: Sandbox, plan: JobPlan) -> None:
        config = sandbox.dir / "config"
        config.mkdir(mode=0o755)
        for name, text in plan.config_files.items():
            (config / name).write_text(text)
        (config / contract.CONFIG_LAUNCH).chmod(0o755)
        (sandbox.dir / "logs").mkdir(mode=0o700)
        for pod in plan.pods:
            ssh_dir = sandbox.dir / "pods" / pod.name / "ssh"
            ssh_dir.mkdir(parents=True, mode=KEY_DIR_MODE)
            for name, text in plan.ssh_files_for(pod.name).items():
                fd = os.open(ssh_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
                with os.fdopen(fd, "w") as handle:
                    handle.write(text)
            owned = [ssh_dir, *ssh_dir.iterdir()]
            for volume in plan.spec.pod.volumes:
                if volume.empty_dir:
                    empty = sandbox.dir / "pods" / pod.name / "volumes" / volume.name
                    empty.mkdir(parents=True)
                    owned.append(empty)
            run_as = plan.spec.pod.run_as
            if run_as is not None:  # the user reads its keys and writes its emptyDirs, as on Kubernetes
                for path in owned:
                    os.chown(path, *run_as)
        self._make_mount_points(sandbox.meta["mount_points"])

    def _refuse_collision(self, plan: JobPlan) -> None:
        """A recorded job of this name that is not this task's earlier attempt stops this one
        before anything is created (or destroyed): see ``local_checks.collision_problem``."""
        if plan.job_name in self._sandboxes:
            return  # this backend's own earlier attempt
        existing = Sandbox.load(self.state_dir, plan.job_name)
        if existing is None:
            return
        problem = collision_problem(
            plan, self.state_dir, existing.meta.get("owner"), existing.owner_pid, existing.owner_alive
        )
        if problem:
            raise LaunchError(problem)

    def _make_mount_points(self, targets: list[str]) -> None:
        """Make the mount points the image has (docker/install-runtime.sh makes them on a host
        too) where this machine lacks them, and remember each directory made, so the last job
        that needs it removes it (``_remove_mount_points``)."""
        with sandboxes.state_lock(self.state_dir):
            made = _read_made(self.state_dir)
            for target in targets:
                missing = [p for p in (Path(target), *Path(target).parents) if not os.path.lexists(p)]
                for path in reversed(missing):
                    path.mkdir(mode=0o755)
                    made.append(str(path))
            _write_made(self.state_dir, made)

    def _remove_mount_points(self) -> None:
        """Remove the mount points jobs of this state directory made that no recorded job still
        needs (deepest first, and only while empty: nothing else's is ever deleted)."""
        with sandboxes.state_lock(self.state_dir):
            made = _read_made(self.state_dir)
            if not made:
                return
            needed = [str(t) for s in sandboxes.records(self.state_dir) for t in s.meta.get("mount_points", [])]
            kept = []
            for path in sorted(made, key=lambda p: p.count("/"), reverse=True):
                if any(n == path or n.startswith(path.rstrip("/") + "/") for n in needed):
                    kept.append(path)
                    continue
                try:
                    os.rmdir(path)
                except OSError as error:  # not empty, or a mount point: no longer only ours
                    if not isinstance(error, FileNotFoundError):
                        log.warning("leaving %s, made for local pods: %s", path, error)
            _write_made(self.state_dir, kept)

    def _start_pod(
        self, sandbox: Sandbox, plan: JobPlan, pod: str, *, pipe_output: bool, extra_env: dict[str, str] | None = None
    ) -> None:
        """``pipe_output``: the master's, whose output is followed and whose standard input is
        its start gate."""
        env = {**self._base_env(plan), **plan.pod(pod).env, **(extra_env or {})}
        with (sandbox.dir / "logs" / f"{pod}.log").open("ab") as log:
            sandbox.start(
                pod,
                ["bash", plan.paths.launch_script],
                env,
                pod_mounts(plan, sandbox.dir, pod),
                subprocess.PIPE if pipe_output else log,
                user=plan.spec.pod.run_as,
                stdin_pipe=pipe_output,
            )

    def _base_env(self, plan: JobPlan) -> dict[str, str]:
        """A container-like environment: not the Airflow worker's. HOME and USER are the pods' user's."""
        env = {"PATH": self.path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "USER": "root"}
        run_as = plan.spec.pod.run_as
        if run_as is not None:
            user = pwd.getpwuid(run_as[0])
            env.update(HOME=user.pw_dir, USER=user.pw_name)
        return env

    # --- readiness, master, output --------------------------------------------------------

    def probe_workers(self, job_name: str) -> list[HostProbe]:
        sandbox = self._sandbox(job_name)
        workers = [p for p in sandbox.pods.values() if p.meta.get("role") == Role.WORKER.value]
        master = next(p for p in sandbox.pods.values() if p.meta.get("role") == Role.MASTER.value)
        master_ssh = sandbox.dir / "pods" / master.name / "ssh"

        def probe(pod: sandboxes.SandboxPod) -> HostProbe:
            host = build_host_name(job_name, pod.name)
            argv = build_ssh_probe_argv(
                host,
                int(sandbox.meta.get("ssh_port", 22)),
                str(master_ssh / contract.SSH_CLIENT_KEY),
                str(master_ssh / contract.SSH_KNOWN_HOSTS),
                connect_timeout=2,
                user=str(sandbox.meta.get("ssh_user", "root")),
            )
            # A port still closed is asked again at once, for a moment: that host's sshd is
            # starting, and waiting for the other hosts' logins first would add a whole round.
            closed_until = time.monotonic() + PORT_CLOSED_RETRY_S
            while True:
                if sandbox.exit_code(pod.name) is not None:
                    tail = " | ".join(self.pod_log_tail(job_name, pod.name, 3))
                    return HostProbe(host, HostProblem.POD_ENDED, tail)
                # From the master's network namespace: its hosts file, its routes, like mpiexec.
                done = subprocess.run(
                    ["ip", "netns", "exec", master.netns, *argv],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=False,
                    stdin=subprocess.DEVNULL,
                )
                got = classify_ssh_result(host, done.returncode, done.stderr)
                if got.problem is not HostProblem.PORT_CLOSED or time.monotonic() >= closed_until:
                    return got
                time.sleep(0.01)

        if not workers:
            return []
        with ThreadPoolExecutor(max_workers=min(32, len(workers))) as pool:
            probes = list(pool.map(probe, workers))
        self._accepted[job_name] = {pod.name for pod, got in zip(workers, probes, strict=True) if got.ok}
        return probes

    def wait_for_change(self, job_name: str, timeout: float) -> None:
        time.sleep(timeout)  # no events locally: readiness is probed

    def start_master(self, job_name: str) -> None:
        """Open the master's start gate (the master runs since ``create``)."""
        plan = self._plans[job_name]
        # Every worker accepted a login from the master's namespace with the master's key
        # (probe_workers, the runner's wait): the master's own identical check is skipped.
        accepted = self._accepted.get(job_name, set())
        checked = bool(plan.workers) and all(w.name in accepted for w in plan.workers)
        word = contract.START_HOSTS_VERIFIED if checked else contract.START_CHECK_HOSTS
        gate = self._sandbox(job_name).procs[plan.master.name].stdin
        if gate is None:
            raise LaunchError(f"the master of {job_name} was started without its start gate")
        try:
            gate.write(f"{word}\n".encode())
            gate.close()
        except BrokenPipeError:
            pass  # the master ended already (e.g. its launcher check failed): the follow reports it

    def follow_master(self, job_name: str, idle_tick: float = 0.1) -> Iterator[list[str]]:
        sandbox = self._sandbox(job_name)
        master = self._plans[job_name].master.name
        proc = sandbox.procs[master]
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        # Each rank's lines reassembled from mpiexec's tagged pieces, each capped (memory stays
        # bounded); a line rewritten with \r (a progress bar) also yields its latest state.
        lines = RankLineSplitter(np=self._plans[job_name].topology.np)  # a tag of no rank of the job is text
        with (sandbox.dir / "logs" / f"{master}.log").open("ab") as log:
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
                _append_bounded(log, chunk)
                batch: list[str] = lines.feed(chunk)
                batch += lines.progress()
                yield batch
        last = lines.flush()
        if last:
            yield last
        proc.wait()

    # --- state ----------------------------------------------------------------------------

    def pod_states(self, job_name: str) -> list[PodState]:
        sandbox = self._sandbox(job_name)
        states = []
        for pod in sandbox.pods.values():
            role = Role(pod.meta.get("role", Role.WORKER.value))
            if not sandbox.started(pod.name):
                states.append(PodState(pod.name, role, PodPhase.PENDING))
                continue
            code = sandbox.exit_code(pod.name)
            if code is None:
                states.append(PodState(pod.name, role, PodPhase.RUNNING, ready=role is Role.WORKER))
            else:
                phase = PodPhase.SUCCEEDED if code == 0 else PodPhase.FAILED
                reason = f"killed by {signal.Signals(-code).name}" if code < 0 else ""
                states.append(PodState(pod.name, role, phase, exit_code=code, reason=reason))
        return states

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        path = self.state_dir / job_name / "logs" / f"{pod}.log"
        try:
            with path.open("rb") as handle:
                handle.seek(max(0, path.stat().st_size - 64 * 1024))
                text = handle.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if line.strip()][-lines:]

    def take_stacks(self, job_name: str, wait: int) -> tuple[dict[str, str], dict[str, str]]:
        """``launch.sh stacks`` in every running pod at once, entered as root (``Sandbox.run_in``)."""
        sandbox = self._sandbox(job_name)
        argv = stacks_command(self._launch_script(job_name), wait)
        return run_in_pods(sandbox, running_pods(sandbox), argv, timeout=wait + 10)

    def give_notice(self, job_name: str, grace: float) -> list[str]:
        """``launch.sh notice`` in every running pod at once, then up to ``grace`` seconds for the
        master to end: mpiexec ends once its ranks have saved and exited (or one's exit aborts
        the rest). Nothing to wait for when no rank was running."""
        sandbox = self._sandbox(job_name)
        argv = ["bash", self._launch_script(job_name), "notice"]
        outputs, errors = run_in_pods(sandbox, running_pods(sandbox), argv, timeout=10)
        lines = [line for text in outputs.values() for line in text.splitlines() if line.strip()]
        lines += [f"notice to pod {pod} failed: {why}" for pod, why in sorted(errors.items())]
        master = next((n for n, p in sandbox.pods.items() if p.meta.get("role") == Role.MASTER.value), None)
        signalled = any(not line.endswith("ranks=") for line in lines if line.startswith("AIRFLOW_MPI_NOTICE"))
        deadline = time.monotonic() + grace
        while signalled and master is not None and sandbox.exit_code(master) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return lines

    def _launch_script(self, job_name: str) -> str:
        plan = self._plans.get(job_name)
        return (plan.paths if plan is not None else contract.DEFAULT_PATHS).launch_script

    # --- teardown -------------------------------------------------------------------------

    def teardown(self, job_name: str) -> None:
        sandbox = self._sandboxes.pop(job_name, None) or Sandbox.load(self.state_dir, job_name)
        self._plans.pop(job_name, None)
        self._accepted.pop(job_name, None)
        if sandbox is not None:
            sandbox.destroy()
            self._remove_mount_points()

    def leftovers(self, job_name: str) -> list[str]:
        sandbox = self._sandboxes.get(job_name) or Sandbox.load(self.state_dir, job_name)
        found = sandbox.leftovers() if sandbox is not None else []
        # Without a record, the names still tell: every pod's namespace is ampl-<job>-<role>-<i>,
        # the bridge's is derived from the job's name.
        prefix, bridge_netns = f"{NETNS_PREFIX}{job_name}-", bridge_netns_name(job_name)
        found += [f"network namespace {ns}" for ns in netns_list() if ns.startswith(prefix) or ns == bridge_netns]
        found += [f"hosts directory {d}" for d in NETNS_HOSTS_DIR.glob(f"{prefix}*")]
        return sorted(set(found))

    def release(self, job_name: str) -> None:
        """Nothing runs between calls here (readiness is probed on demand): nothing to stop."""

    def sweep(self) -> list[str]:
        """Remove every job whose owner process is gone (a crashed task or CLI run)."""
        swept = sweep(self.state_dir, keep=list(self._sandboxes))
        if swept:
            self._remove_mount_points()
        return swept

    def sweep_orphans(self) -> list[str]:
        removed = sweep_orphans(self.state_dir)
        self._remove_mount_points()
        return removed

    def _sandbox(self, job_name: str) -> Sandbox:
        sandbox = self._sandboxes.get(job_name) or Sandbox.load(self.state_dir, job_name)
        if sandbox is None:
            raise JobNotFound(f"no local job {job_name} (never created, or already torn down)")
        return sandbox


def _read_made(state_dir: Path) -> list[str]:
    try:
        made = json.loads((state_dir / MADE_MOUNT_POINTS).read_text())
    except (FileNotFoundError, ValueError):
        return []
    # Only absolute, normalised paths are ever written: anything else is not ours to remove.
    return [p for p in made if isinstance(p, str) and p.startswith("/") and os.path.normpath(p) == p and p != "/"]


def _write_made(state_dir: Path, made: list[str]) -> None:
    path = state_dir / MADE_MOUNT_POINTS
    if not made:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f"{MADE_MOUNT_POINTS}.tmp")
    tmp.write_text(json.dumps(sorted(set(made))))
    tmp.replace(path)


def _user_name(plan: JobPlan) -> str:
    """Who ssh logs in as: root, or the name of ``pod.run_as_user`` on this machine."""
    run_as = plan.spec.pod.run_as
    return "root" if run_as is None else pwd.getpwuid(run_as[0]).pw_name


def _warn_about_gpus(plan: JobPlan) -> None:
    """A GPU spec runs here on CPUs, with the ranks and hosts Kubernetes would give it: say so in
    the task log (a dev loop for a GPU job; docs/guides/local.md)."""
    master, workers = plan.spec.master.gpus, plan.spec.workers.gpus
    if master or workers:
        log.warning(
            "the local backend has no GPUs: ranks run on CPUs; slots follow the GPU counts (master %d, "
            "workers %d per pod), so job %s runs %d rank(s) on the hosts Kubernetes would give it",
            master,
            workers,
            plan.job_name,
            plan.topology.np,
        )


def _append_bounded(log: BinaryIO, chunk: bytes) -> None:
    """Append to an append-mode log file; past MASTER_LOG_MAX keep only its last MASTER_LOG_KEEP bytes."""
    log.write(chunk)
    if log.tell() <= MASTER_LOG_MAX:
        return
    log.flush()
    with open(log.name, "r+b") as handle:
        handle.seek(-MASTER_LOG_KEEP, os.SEEK_END)
        tail = handle.read()
        handle.seek(0)
        handle.write(tail)
        handle.truncate()
    log.seek(0, os.SEEK_END)
