"""A single-node-set Kubernetes control plane on loopback, from the binaries build.py made:
etcd, kube-apiserver (Node,RBAC authorization, NodeRestriction and PodSecurity admission),
kube-controller-manager (garbage collector, job, namespace, serviceaccount, node lifecycle,
root CA publisher, ...) and kube-scheduler. Started in seconds, stopped with nothing left.

Every process is this one's child and dies with it (parent-death signal), its output goes to
``<workdir>/logs/<name>.log``. Nothing listens beyond 127.0.0.0/8: the apiserver advertises
127.0.0.1 and reconciles no endpoints (no pod here talks to it; controllers run outside pods).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.build import COMPONENTS, bin_dir
from tests.cluster.pki import PKI, KeyPair

SERVICE_CIDR = "10.0.0.0/24"  # allocated only: no pod reaches a ClusterIP (no kube-proxy)
_PR_SET_PDEATHSIG = 1
LOCKS = Path("/run/lock")  # host_lock's files (airflow-mpi-tests-<name>.lock), where lock files belong


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# The parent-death signal fires when the *thread* that forked the child ends: every process is
# forked from this one long-lived thread, so one restarted from a short-lived thread (a fault
# test's) lives on.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cluster-spawner")


def host_lock(name: str, timeout: float) -> int:
    """An exclusive lock on this host, as an open file descriptor: for what only one process of
    every test session here may use at a time (a port a controller does not let one change). Hand
    it to the process that uses the thing (``Process.pass_fds``), then close it here: the lock
    is held exactly while that process lives, even past a SIGKILLed test session."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCKS / f"airflow-mpi-tests-{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise TimeoutError(f"{name}: still held by another test session after {timeout:.0f}s") from None
            time.sleep(0.5)


@dataclass
class Process:
    """A child process of the control plane with its log file."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    pass_fds: tuple[int, ...] = ()  # e.g. a ``host_lock`` the process holds while it runs
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = _SPAWNER.submit(
                subprocess.Popen,
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                pass_fds=self.pass_fds,
                preexec_fn=_die_with_parent,
                start_new_session=True,
            ).result()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace: float = 10) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; waits until it is gone."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        self.popen = None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def wait_for(what: str, check: Callable[[], bool], timeout: float, process: Process | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and not process.alive:
            raise RuntimeError(f"{process.name} exited while waiting for {what}:\n{process.tail()}")
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.2)
    tail = f":\n{process.tail()}" if process is not None else ""
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s{tail}")


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler under ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.pki_dir = workdir / "pki"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.processes: dict[str, Process] = {}
        self.pki: PKI | None = None
        self.admin: KeyPair | None = None
        self.admin_kubeconfig = workdir / "admin.kubeconfig"
        self.started_seconds: dict[str, float] = {}

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        for component in ("etcd", "kubernetes"):
            if not (bin_dir(COMPONENTS[component]) / ".complete").exists():
                raise RuntimeError(f"{component} is not built: run `python tests/cluster/build.py`")
        self.workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            t0 = time.monotonic()
            self._make_pki()
            self._start_etcd()
            self._start_apiserver()
            self.started_seconds["apiserver"] = time.monotonic() - t0
            self._start_controller_manager()
            self._start_scheduler()
            self.started_seconds["control plane"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Every process (reverse start order), then the working directory."""
        for name in reversed(list(self.processes)):
            self.processes[name].stop()
        self.processes.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- pieces ----------------------------------------------------------------------------

    def _make_pki(self) -> None:
        pki = self.pki = PKI(self.pki_dir)
        self.serving = pki.issue(
            "apiserver",
            "kube-apiserver",
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=("127.0.0.1", "10.0.0.1"),
            client=False,
        )
        self.kubelet_client = pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("kube:masters",))
        self.sa = pki.service_account_keys()
        self.admin = pki.issue("admin", "airflow-mpi-admin", ("system:masters",))
        pki.kubeconfig(self.admin_kubeconfig, self.server, "admin", pair=self.admin)
        for user, cn in (
            ("controller-manager", "system:kube-controller-manager"),
            ("scheduler", "system:kube-scheduler"),
        ):
            pki.kubeconfig(self.workdir / f"{user}.kubeconfig", self.server, user, pair=pki.issue(user, cn))

    def node_credentials(self, node: str, address: str) -> tuple[Path, KeyPair]:
        """A node's kubeconfig (``system:node:<node>`` in ``system:nodes``, what NodeRestriction
        and the Node authorizer expect of a kubelet) and its kubelet serving certificate."""
        assert self.pki is not None
        client = self.pki.issue(f"node-{node}", f"system:node:{node}", ("system:nodes",))
        kubeconfig = self.pki.kubeconfig(self.workdir / f"node-{node}.kubeconfig", self.server, node, pair=client)
        serving = self.pki.issue(f"kubelet-{node}", node, server_names=(node,), server_ips=(address,), client=False)
        return kubeconfig, serving

    def _binary(self, component: str, name: str) -> str:
        return str(bin_dir(COMPONENTS[component]) / name)

    def _spawn(self, name: str, argv: Sequence[str]) -> Process:
        process = Process(name, list(argv), self.workdir / "logs" / f"{name}.log")
        process.start()
        self.processes[name] = process
        return process

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                self._binary("etcd", "etcd"),
                "--name",
                "default",
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"default={peer}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )
        wait_for("etcd", lambda: _http_ok(f"{client}/health"), 30, etcd)

    def apiserver_argv(self) -> list[str]:
        pki = self.pki_dir
        return [
            self._binary("kubernetes", "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa.cert}",
            f"--service-account-signing-key-file={self.sa.key}",
            # A pod's projected token lives as long as it asked (600 s at least), never the
            # year the apiserver otherwise grants the kubelet's default tokens: the kubelet must
            # rotate it, and a test of a long job sees that happen.
            "--service-account-extend-token-expiration=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",  # PodSecurity is on by default
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ]

    def _start_apiserver(self) -> None:
        apiserver = self._spawn("kube-apiserver", self.apiserver_argv())
        wait_for("kube-apiserver", lambda: self.get("/readyz") == "ok", 90, apiserver)

    def restart_apiserver(self) -> None:
        """Stop the apiserver and start it again on the same port and etcd (a fault test)."""
        self.processes.pop("kube-apiserver").stop()
        self._start_apiserver()

    def _start_controller_manager(self) -> None:
        self._start_component(
            "kube-controller-manager",
            "controller-manager",
            [
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.sa.key}",
                f"--root-ca-file={self.pki_dir / 'ca.crt'}",
                f"--cluster-signing-cert-file={self.pki_dir / 'ca.crt'}",
                f"--cluster-signing-key-file={self.pki_dir / 'ca.key'}",
                "--controllers=*",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--node-monitor-grace-period=40s",
            ],
        )

    def _start_scheduler(self) -> None:
        self._start_component("kube-scheduler", "scheduler", [])

    def _start_component(self, binary: str, user: str, flags: list[str]) -> None:
        """A controller-manager or scheduler: its own kubeconfig for the API, for authenticating
        and authorizing its own /healthz, no leader election, serving on loopback."""
        kubeconfig = self.workdir / f"{user}.kubeconfig"
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--v=1",
        ]
        process = self._spawn(binary, [self._binary("kubernetes", binary), *common, *flags])
        self._wait_healthz(process)

    def stop_component(self, name: str) -> Process:
        """Stop one process (a fault test); ``start_component`` starts it again."""
        process = self.processes[name]
        process.stop()
        return process

    def start_component(self, name: str) -> None:
        process = self.processes[name]
        process.start()
        if name in ("kube-controller-manager", "kube-scheduler"):
            self._wait_healthz(process)

    def _wait_healthz(self, process: Process) -> None:
        port = next(a.split("=", 1)[1] for a in process.argv if a.startswith("--secure-port="))
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # a self-signed serving certificate of its own
        wait_for(process.name, lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", context), 60, process)

    # --- API access for the harness --------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        assert self.admin is not None
        context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        context.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        return context

    def request(
        self, method: str, path: str, body: object | None = None, content_type: str = "application/json"
    ) -> object:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, context=self.ssl_context(), timeout=30) as response:
            text = response.read().decode()
        return json.loads(text) if text.startswith("{") else text

    def get(self, path: str) -> object:
        return self.request("GET", path)


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, context=context, timeout=2) as response:
        return response.status == 200
