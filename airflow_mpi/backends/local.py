"""The embedded local backend: every pod of a plan runs in a sandbox on this machine.

One sandbox (``backends.sandbox``) per job: its own bridge and /24, one namespaced process
tree per pod with the pod's files at the pod paths (``/etc/mpi``, the ssh Secret directory), a
private ``/tmp`` (Open MPI's session directory: daemons sharing one crashed intermittently),
private ``/run/airflow-mpi`` and ``/run/sshd``, and ``/etc/hosts`` naming every ``<pod>.<job>``.
Every pod runs the same launch script with the same env as on Kubernetes. A job with
``pod.run_as_user`` runs every pod as that user of this machine, without capabilities, its ssh
files and runtime directory owned by it (what the image and ``fsGroup`` give it on Kubernetes).

State lives in ``<state_dir>/<job>/``; the next job to start sweeps what a crashed owner left.
Several jobs at once get separate names, bridges and subnets.
"""

from __future__ import annotations

import logging
import os
import pwd
import select
import shutil
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
from airflow_mpi.backends.processes import netns_list
from airflow_mpi.backends.sandbox import Mount, Sandbox
from airflow_mpi.exceptions import BackendUnavailable, JobNotFound, LaunchError, SpecError, SpecIssue
from airflow_mpi.job.naming import build_host_name
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.job.ssh import KEY_DIR_MODE, KEY_FILE_MODE, build_ssh_probe_argv
from airflow_mpi.observe.lines import RankLineSplitter
from airflow_mpi.observe.readiness import HostProbe, HostProblem, classify_ssh_result
from airflow_mpi.observe.stacks import stacks_command
from airflow_mpi.observe.status import PodPhase, PodState
from airflow_mpi.spec import Role

log = logging.getLogger(__name__)
DEFAULT_STATE_DIR = Path("/run/airflow-mpi-local")
PRIVATE_ROOTS = ("/tmp",)  # every local pod mounts its own empty tmpfs here
REQUIRED_TOOLS = ("ip", "unshare", "setpriv", "mount", "nsenter", "ssh", "mpiexec", "bash")
SSHD = "/usr/sbin/sshd"
READ_CHUNK = 1 << 20
# The master's log file (in memory, under /run) keeps its last MASTER_LOG_KEEP bytes once it
# passes MASTER_LOG_MAX: it only serves the "last lines" of failure messages.
MASTER_LOG_MAX = 16 << 20
MASTER_LOG_KEEP = 1 << 20


def check_prerequisites(path: str | None = None, state_dir: Path | None = None) -> list[str]:
    """What this machine lacks to run the local backend (empty when it can).

    ``path`` is the PATH pods get (its first entry is the interpreter's directory) and
    ``state_dir`` where job files live: neither may be under /tmp, which every pod gets as an
    empty private tmpfs, so the ranks would not find Python or the launch script.
    """
    problems = []
    python_dir = (path or os.path.dirname(sys.executable)).split(os.pathsep)[0]
    if _under(python_dir, PRIVATE_ROOTS):
        problems.append(
            f"a Python outside /tmp: this one ({python_dir}) is under /tmp, which every local pod gets as an"
            " empty private tmpfs, so ranks cannot run it; install the virtualenv elsewhere (e.g. /var/tmp, /opt)"
        )
    if state_dir is not None and _under(str(state_dir), PRIVATE_ROOTS):
        problems.append(
            f"a state_dir outside /tmp: {state_dir} is hidden inside every local pod (private /tmp);"
            " leave state_dir unset or pick e.g. /var/tmp/airflow-mpi"
        )
    if os.geteuid() != 0:
        problems.append("root (network, PID and mount namespaces need it): run as root")
    for tool in REQUIRED_TOOLS:
        if shutil.which(tool) is None:
            package = {"ip": "iproute2", "ssh": "openssh-client", "mpiexec": "openmpi-bin"}.get(tool, "util-linux")
            problems.append(f"'{tool}' (apt-get install {package})")
    if not Path(SSHD).exists():
        problems.append(f"{SSHD} (apt-get install openssh-server)")
    return problems


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
        self._check_supported(plan)
        _warn_about_gpus(plan)
        sandboxes.sweep(self.state_dir, keep=list(self._sandboxes))
        self.teardown(plan.job_name)  # an earlier attempt of this very job
        meta = {"ssh_port": plan.spec.ssh_port, "ssh_user": _user_name(plan)}
        sandbox = Sandbox.create(self.state_dir, plan.job_name, meta=meta)
        self._sandboxes[plan.job_name] = sandbox
        self._plans[plan.job_name] = plan
        try:
            sandbox.add_pods([p.name for p in plan.pods], meta={p.name: {"role": p.role.value} for p in plan.pods})
            sandbox.write_hosts([(sandbox.pods[p.name].ip, (p.host, p.name)) for p in plan.pods])
            self._write_files(sandbox, plan)
            for worker in plan.workers:
                self._start_pod(sandbox, plan, worker.name, pipe_output=False)
        except BaseException as error:
            self.teardown(plan.job_name)
            if isinstance(error, subprocess.SubprocessError | OSError):
                raise LaunchError(f"local backend could not create job {plan.job_name}: {error}") from error
            raise

    def _check_supported(self, plan: JobPlan) -> None:
        issues = []
        if len(plan.pods) > sandboxes.MAX_PODS:
            issues.append(
                SpecIssue(
                    "workers.replicas",
                    f"{len(plan.pods)} pods exceed the local backend's {sandboxes.MAX_PODS}",
                    "use fewer",
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
            elif volume.host_path and not (Path(volume.host_path) / (volume.sub_path or "")).exists():
                issues.append(SpecIssue(f"{path}.host_path", f"{volume.host_path} does not exist here", "create it"))
            if volume.host_path and _under(volume.host_path, (*PRIVATE_ROOTS, plan.paths.runtime_dir, "/run/sshd")):
                issues.append(
                    SpecIssue(
                        f"{path}.host_path",
                        "is under /tmp or /run/sshd, which every local pod gets privately",
                        "share data from another directory, e.g. /var/tmp/...",
                    )
                )
        for index, argument in enumerate(plan.spec.command):
            if argument.startswith("/") and _under(argument, PRIVATE_ROOTS) and Path(argument).exists():
                issues.append(
                    SpecIssue(
                        f"command[{index}]",
                        f"{argument} is under /tmp, which every local pod gets as an empty private tmpfs",
                        "move the file elsewhere, e.g. /var/tmp/...",
                    )
                )
        issues += _check_run_as(plan)
        if issues:
            raise SpecError(issues)

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
        # Mount points the image has (docker/install-runtime.sh makes them on the host too).
        mount_points = {m.target for p in plan.pods for m in pod_mounts(plan, sandbox.dir, p.name)}
        for target in mount_points:
            Path(target).mkdir(parents=True, exist_ok=True)

    def _start_pod(
        self, sandbox: Sandbox, plan: JobPlan, pod: str, *, pipe_output: bool, extra_env: dict[str, str] | None = None
    ) -> None:
        env = {**self._base_env(plan), **plan.pod(pod).env, **(extra_env or {})}
        with (sandbox.dir / "logs" / f"{pod}.log").open("ab") as log:
            sandbox.start(
                pod,
                ["bash", plan.paths.launch_script],
                env,
                pod_mounts(plan, sandbox.dir, pod),
                subprocess.PIPE if pipe_output else log,
                user=plan.spec.pod.run_as,
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
            if sandbox.exit_code(pod.name) is not None:
                tail = " | ".join(self.pod_log_tail(job_name, pod.name, 3))
                return HostProbe(host, HostProblem.POD_ENDED, tail)
            argv = build_ssh_probe_argv(
                host,
                int(sandbox.meta.get("ssh_port", 22)),
                str(master_ssh / contract.SSH_CLIENT_KEY),
                str(master_ssh / contract.SSH_KNOWN_HOSTS),
                connect_timeout=2,
                user=str(sandbox.meta.get("ssh_user", "root")),
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

        if not workers:
            return []
        with ThreadPoolExecutor(max_workers=min(32, len(workers))) as pool:
            probes = list(pool.map(probe, workers))
        self._accepted[job_name] = {pod.name for pod, got in zip(workers, probes, strict=True) if got.ok}
        return probes

    def wait_for_change(self, job_name: str, timeout: float) -> None:
        time.sleep(timeout)  # no events locally: readiness is probed

    def start_master(self, job_name: str) -> None:
        plan = self._plans[job_name]
        # Every worker accepted a login from the master's namespace with the master's key
        # (probe_workers, the runner's wait): the master's own identical check is skipped.
        accepted = self._accepted.get(job_name, set())
        checked = bool(plan.workers) and all(w.name in accepted for w in plan.workers)
        verified = {contract.ENV_HOSTS_VERIFIED: "1"} if checked else {}
        self._start_pod(self._sandbox(job_name), plan, plan.master.name, pipe_output=True, extra_env=verified)

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
        plan = self._plans.get(job_name)
        argv = stacks_command((plan.paths if plan is not None else contract.DEFAULT_PATHS).launch_script, wait)
        running = [pod for pod in sandbox.pods if sandbox.started(pod) and sandbox.exit_code(pod) is None]
        outputs: dict[str, str] = {}
        errors: dict[str, str] = {}

        def ask(pod: str) -> None:
            try:
                done = sandbox.run_in(pod, argv, timeout=wait + 10)
            except (LaunchError, OSError, subprocess.SubprocessError) as error:
                errors[pod] = str(error)
                return
            if done.returncode != 0:
                errors[pod] = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            outputs[pod] = done.stdout

        if running:
            with ThreadPoolExecutor(max_workers=min(32, len(running))) as pool:
                list(pool.map(ask, running))
        return outputs, errors

    # --- teardown -------------------------------------------------------------------------

    def teardown(self, job_name: str) -> None:
        sandbox = self._sandboxes.pop(job_name, None) or Sandbox.load(self.state_dir, job_name)
        self._plans.pop(job_name, None)
        self._accepted.pop(job_name, None)
        if sandbox is not None:
            sandbox.destroy()

    def leftovers(self, job_name: str) -> list[str]:
        sandbox = self._sandboxes.get(job_name) or Sandbox.load(self.state_dir, job_name)
        found = sandbox.leftovers() if sandbox is not None else []
        # Without a record, the names still tell: every pod's namespace is ampl-<job>-<role>-<i>.
        prefix = f"{sandboxes.NETNS_PREFIX}{job_name}-"
        found += [f"network namespace {ns}" for ns in netns_list() if ns.startswith(prefix)]
        found += [f"hosts directory {d}" for d in sandboxes.NETNS_HOSTS_DIR.glob(f"{prefix}*")]
        return sorted(set(found))

    def release(self, job_name: str) -> None:
        """Nothing runs between calls here (readiness is probed on demand): nothing to stop."""

    def sweep(self) -> list[str]:
        """Remove every job whose owner process is gone (a crashed task or CLI run)."""
        return sandboxes.sweep(self.state_dir, keep=list(self._sandboxes))

    def sweep_orphans(self) -> list[str]:
        return sandboxes.sweep_orphans(self.state_dir)

    def _sandbox(self, job_name: str) -> Sandbox:
        sandbox = self._sandboxes.get(job_name) or Sandbox.load(self.state_dir, job_name)
        if sandbox is None:
            raise JobNotFound(f"no local job {job_name} (never created, or already torn down)")
        return sandbox


def _user_name(plan: JobPlan) -> str:
    """Who ssh logs in as: root, or the name of ``pod.run_as_user`` on this machine."""
    run_as = plan.spec.pod.run_as
    return "root" if run_as is None else pwd.getpwuid(run_as[0]).pw_name


def _check_run_as(plan: JobPlan) -> list[SpecIssue]:
    """The pods run this machine's files: a non-root uid needs a user here, as it needs one in an
    image (ssh and sshd need its name, home and shell)."""
    run_as = plan.spec.pod.run_as
    if run_as is None:
        return []
    uid = run_as[0]
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return [
            SpecIssue(
                "pod.run_as_user",
                f"uid {uid} has no user on this machine, and the local backend runs the pods here: ssh and sshd "
                "need a user name, home and shell for it",
                f"create one: useradd --uid {uid} --create-home --shell /bin/bash mpiuser",
            )
        ]
    if user.pw_shell.endswith(("/nologin", "/false")):
        return [
            SpecIssue(
                "pod.run_as_user",
                f"the user {user.pw_name} (uid {uid}) has the shell {user.pw_shell}, so every command mpiexec "
                "starts over ssh would be refused",
                f"give it a shell: usermod --shell /bin/bash {user.pw_name}",
            )
        ]
    return []


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


def _under(path: str, roots: tuple[str, ...]) -> bool:
    clean = os.path.normpath(path)
    return any(clean == root or clean.startswith(root.rstrip("/") + "/") for root in roots)
