"""The whole test cluster: the control plane, the node agent's Nodes, and (on request) the
real controllers. ``python -m tests.cluster up|down|status`` runs it for a user (``make
cluster-up``), ``airflow-up [DAGS]`` deploys Airflow into it (tests/cluster/airflow.py, ``make
airflow-up``); the pytest fixtures in tests/cluster/conftest.py run one per test session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.build import COMPONENTS, K8S_VERSION, bin_dir, is_built
from tests.cluster.controlplane import ControlPlane, Process, free_port, wait_for
from tests.cluster.kubeapi import ApiError, KubeApi, Obj
from tests.cluster.nodes import RealNodes

REPO = Path(__file__).resolve().parents[2]
STATE_ROOT = Path("/run/airflow-mpi-tests")
NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2", "ephemeral-storage": "100Gi"}
RBAC_GROUP = "rbac.authorization.k8s.io"
MISSING_IMAGE = "registry.invalid/airflow-mpi/missing:1"  # the node agent answers ErrImagePull
REQUIRED = ("etcd", "kubernetes")


def built(components: tuple[str, ...] = REQUIRED) -> bool:
    return all(is_built(COMPONENTS[name]) for name in components)


class Cluster:
    """A control plane under ``workdir`` with ``nodes`` Nodes: real ones (a kubelet, containerd
    and runc each; tests/cluster/nodes.py) when ``images`` are given, else run by the node agent."""

    def __init__(self, workdir: Path, nodes: int = 3, images: list[Path] | None = None) -> None:
        self.workdir = workdir
        self.plane = ControlPlane(workdir / "plane")
        self.node_count = nodes
        self.images = images
        self.real: RealNodes | None = None
        self.agent: Process | None = None
        self.agent_control = ""
        self.controllers: dict[str, Process] = {}
        self.timings: dict[str, float] = {}
        self.state_dir = STATE_ROOT / f"cluster-{os.getpid()}"

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    def api(self) -> KubeApi:
        return KubeApi(self.kubeconfig)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        t0 = time.monotonic()
        try:
            self.plane.start()
            self.timings["control plane"] = time.monotonic() - t0
            if self.images:
                self.real = RealNodes(self.plane, self.workdir / "nodes", self.node_count, self.images)
                self.real.start()
                self.timings.update(self.real.timings)
            else:
                self._start_node_agent()
            self.wait_nodes_ready()
            self._wait_default_service_account()
            self.timings["cluster"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """The node agent first (it stops every pod and removes its namespaces and links),
        then the control plane, then the working directories."""
        for process in self.controllers.values():
            process.stop()
        self.controllers.clear()
        if self.agent is not None:
            self.agent.stop(grace=60)
            self.agent = None
        if self.real is not None:
            self.real.stop()
        self.plane.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _start_node_agent(self) -> None:
        nodes = []
        for index in range(self.node_count):
            name, address = f"node-{index}", f"127.0.100.{index + 1}"
            kubeconfig, serving = self.plane.node_credentials(name, address)
            nodes.append({
                "name": name, "address": address, "port": free_port(address), "kubeconfig": str(kubeconfig),
                "serving_cert": str(serving.cert), "serving_key": str(serving.key),
                "ca": str(self.plane.pki_dir / "ca.crt"), "capacity": NODE_CAPACITY,
            })  # fmt: skip
        config = {
            "workdir": str(self.workdir / "agent"), "state_dir": str(self.state_dir), "nodes": nodes,
            "missing_images": [MISSING_IMAGE], "kubelet_version": K8S_VERSION,
        }  # fmt: skip
        path = self.workdir / "agent.json"
        path.write_text(json.dumps(config))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        self.agent = Process("node-agent", [sys.executable, "-m", "tests.cluster.node_agent", str(path)],
                             self.workdir / "node-agent.log", env=env)  # fmt: skip
        self.agent.start()
        wait_for("node agent", lambda: '"ready": true' in self.agent_log(), 60, self.agent)
        line = next(x for x in self.agent_log().splitlines() if '"ready": true' in x)
        self.agent_control = f"http://127.0.0.1:{json.loads(line)['control_port']}"

    def agent_log(self) -> str:
        try:
            return (self.workdir / "node-agent.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_nodes_ready(self, timeout: float = 90) -> None:
        """Until every Node reports Ready and carries none of the node lifecycle controller's taints."""
        api = self.api()

        def ready() -> bool:
            nodes = api.get("/api/v1/nodes")["items"]
            ok = [
                n for n in nodes
                if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
                and not any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints") or [])
            ]  # fmt: skip
            return len(ok) >= self.node_count

        wait_for("Nodes Ready and untainted", ready, timeout, self.agent)

    def _wait_default_service_account(self) -> None:
        api = self.api()
        wait_for(
            "the default ServiceAccount",
            lambda: api.get_or_none("/api/v1/namespaces/default/serviceaccounts/default"),
            60,
        )

    # --- for tests -------------------------------------------------------------------------

    def controller(self, name: str) -> Process:
        """Start a real controller (``mpi-operator``, ``kueue``, ``volcano``, ``jobset``,
        ``trainer``: with JobSet) once; later calls return the running one."""
        from tests.cluster import controllers, volcano

        if name == "volcano":  # three processes; the scheduler stands for them
            if not all(self.controllers.get(p) and self.controllers[p].alive for p in volcano.PROCESSES):
                for part in volcano.start_volcano(self):
                    self.controllers[part.name] = part
            return self.controllers["vc-scheduler"]
        process = self.controllers.get(name)
        if process is None or not process.alive:
            starters = {
                "mpi-operator": controllers.start_mpi_operator,
                "kueue": controllers.start_kueue,
                "jobset": controllers.start_jobset,
                "trainer": controllers.start_trainer,
            }
            process = self.controllers[name] = starters[name](self)
        return process

    def agent_request(self, path: str, method: str = "POST") -> str:
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(self.agent_control + path, method=method), timeout=30) as r:
            return r.read().decode()

    def evict(self, namespace: str, pod: str, message: str = "The node was low on resource: memory. ") -> None:
        """The node agent evicts as a kubelet under pressure would; with real Nodes, the pod is
        evicted through the Eviction API (what `kubectl drain` does)."""
        import urllib.parse

        if self.real is not None:
            self.api().create(f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", {
                "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}})  # fmt: skip
            return

        query = urllib.parse.urlencode({"namespace": namespace, "pod": pod, "message": message})
        self.agent_request(f"/evict?{query}")

    def running_pods(self) -> list[str]:
        if self.real is not None:
            return self.real.running_pods()
        return list(json.loads(self.agent_request("/", method="GET"))["sandbox_pods"])

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.api().create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": name, "labels": labels or {}}})  # fmt: skip
        wait_for(f"namespace {name}'s default ServiceAccount",
                 lambda: self.api().get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"), 60)  # fmt: skip

    def delete_namespace(self, name: str, wait: float = 120) -> None:
        """Delete a namespace; wait up to ``wait`` seconds until it is gone (0: do not wait)."""
        api = self.api()
        api.delete(f"/api/v1/namespaces/{name}")
        if wait:
            wait_for(f"namespace {name} gone", lambda: api.get_or_none(f"/api/v1/namespaces/{name}") is None, wait)

    def service_account_kubeconfig(self, namespace: str, name: str, rules: list[Obj], path: Path) -> Path:
        """A ServiceAccount bound to a Role with ``rules`` only, and a kubeconfig with its token."""
        role = {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules}
        kubeconfig = self.bind_service_account(namespace, name, role, path)
        config = yaml.safe_load(kubeconfig.read_text())
        config["contexts"][0]["context"]["namespace"] = namespace
        kubeconfig.write_text(yaml.safe_dump(config))
        return kubeconfig

    def bind_service_account(self, namespace: str, name: str, role: Obj, path: Path) -> Path:
        """ServiceAccount ``name`` bound to ``role`` (a Role, or a ClusterRole bound cluster-wide),
        both created or replaced; a kubeconfig with a token of it at ``path``."""
        api = self.api()
        cluster_wide = role["kind"] == "ClusterRole"
        role = dict(role, metadata={"name": name})
        rbac = f"/apis/{RBAC_GROUP}/v1" + ("" if cluster_wide else f"/namespaces/{namespace}")
        api.apply_object(f"{rbac}/{role['kind'].lower()}s", role)
        account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        api.apply_object(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
        binding = {
            "apiVersion": f"{RBAC_GROUP}/v1",
            "kind": f"{role['kind']}Binding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": role["kind"], "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
        api.apply_object(f"{rbac}/{binding['kind'].lower()}s", binding)
        token = api.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}},
        )["status"]["token"]
        assert self.plane.pki is not None
        return self.plane.pki.kubeconfig(path, self.plane.server, f"{namespace}-{name}", token=token)


# --- `python -m tests.cluster up|down|status` --------------------------------------------------

CHECKOUT_STATE = REPO / ".cluster"
CONTROLLERS = ("mpi-operator", "volcano", "kueue", "trainer")  # what `make cluster-up` starts
UP_TIMEOUT = 600  # about 1 minute on an idle 2-core machine; several beside other heavy work
STOP_TIMEOUT = 300  # the Nodes' pods stopped, the control plane, the host's settings restored


def up(nodes: int = 3) -> int:
    """Build what is missing, start the cluster in a background supervisor, write the admin
    kubeconfig to .cluster/kubeconfig, and return once the Nodes are Ready."""
    if (CHECKOUT_STATE / "supervisor.pid").exists() and _alive(int((CHECKOUT_STATE / "supervisor.pid").read_text())):
        print(f"the cluster is already up: KUBECONFIG={CHECKOUT_STATE / 'kubeconfig'}")
        return 0
    from tests.cluster import build

    for name in build.TIER:
        build.build(COMPONENTS[name], log=lambda m: print(m, flush=True))
    CHECKOUT_STATE.mkdir(exist_ok=True)
    ready = CHECKOUT_STATE / "ready"
    ready.unlink(missing_ok=True)
    log = (CHECKOUT_STATE / "supervisor.log").open("ab")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "tests.cluster", "supervise", str(nodes)], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    (CHECKOUT_STATE / "supervisor.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + UP_TIMEOUT
    while time.monotonic() < deadline and not ready.exists():
        if proc.poll() is not None:
            print((CHECKOUT_STATE / "supervisor.log").read_text()[-4000:], file=sys.stderr)
            return 1
        time.sleep(0.5)
    if ready.exists():
        print(ready.read_text())
        return 0
    # Not up in time: stop what the supervisor started, so a failed `up` leaves nothing running.
    stopped = _stop_supervisor(proc.pid)
    print((CHECKOUT_STATE / "supervisor.log").read_text()[-4000:], file=sys.stderr)
    print(f"the cluster did not come up in {UP_TIMEOUT} s; "
          + ("what it had started is stopped" if stopped else "its supervisor would not stop: `make cluster-down`"))  # fmt: skip
    return 1


def supervise(nodes: int) -> int:
    """Run the cluster until SIGTERM (what `up` starts in the background)."""
    import signal

    from tests.cluster.image import cached_archives
    from tests.cluster.nodes import node_tools_built

    started = time.monotonic()
    images = list(cached_archives().values()) if node_tools_built() else []
    cluster = Cluster(CHECKOUT_STATE / "run", nodes, images=images or None)

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the stop that follows runs to its end
        raise KeyboardInterrupt(f"signal {signum}")

    # SIGTERM (`down`, or `up` giving up) ends the supervisor wherever it is, starting included.
    signal.signal(signal.SIGTERM, stop)
    try:
        cluster.start()
        for name in CONTROLLERS:
            cluster.controller(name)
        shutil.copy(cluster.kubeconfig, CHECKOUT_STATE / "kubeconfig")
        # What `airflow-up`, another process, needs to reach this cluster's Nodes and volumes.
        real = [{"index": n.index, "name": n.name, "address": n.address, "workdir": str(n.workdir),
                 "state": str(n.state)} for n in (cluster.real.nodes if cluster.real else [])]  # fmt: skip
        (CHECKOUT_STATE / "cluster.json").write_text(json.dumps({"workdir": str(cluster.workdir), "nodes": real}))
        (CHECKOUT_STATE / "ready").write_text(
            f"cluster up in {time.monotonic() - started:.1f} s: {nodes} {'real ' if images else ''}Nodes Ready; "
            f"{', '.join(CONTROLLERS)} running\n"
            f"export KUBECONFIG={CHECKOUT_STATE / 'kubeconfig'}\n"
        )
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()
    return 0


@dataclass
class Attached:
    """The cluster a supervisor runs, as another process reaches it: its admin kubeconfig, its
    working directory and its real Nodes (their containerd sockets)."""

    workdir: Path
    kubeconfig: Path
    real: Any

    def api(self) -> KubeApi:
        return KubeApi(self.kubeconfig)


def attach() -> Attached:
    from types import SimpleNamespace

    from tests.cluster.nodes import Node

    state = json.loads((CHECKOUT_STATE / "cluster.json").read_text())
    nodes = [Node(n["index"], n["name"], n["address"], Path(n["workdir"]), Path(n["state"])) for n in state["nodes"]]
    return Attached(Path(state["workdir"]), CHECKOUT_STATE / "kubeconfig", SimpleNamespace(nodes=nodes))


def airflow_up(dags: Path) -> int:
    """Deploy Airflow into the running cluster (`make airflow-up DAGS=...`); write
    .cluster/airflow.env with its URL and admin login. `down` removes it with the cluster."""
    from tests.cluster import airflow

    if not (CHECKOUT_STATE / "ready").exists():
        print("the cluster is down: run `make cluster-up` first", file=sys.stderr)
        return 1
    cluster = attach()
    if not cluster.real.nodes:
        print("Airflow runs on real Nodes: this cluster runs the node agent (build them: `make cluster-build image`)",
              file=sys.stderr)  # fmt: skip
        return 1
    deployment = airflow.deploy(cluster, dags, log=lambda m: print(m, flush=True))
    env = CHECKOUT_STATE / "airflow.env"
    env.write_text(
        f"AIRFLOW_URL={deployment.url}\nAIRFLOW_USER={deployment.user}\nAIRFLOW_PASSWORD={deployment.password}\n"
    )
    env.chmod(0o600)
    print(f"Airflow up in {deployment.timings['up']:.0f} s at {deployment.url} (DAGs: {dags}); login in {env}")
    return 0


def down() -> int:
    pid_file = CHECKOUT_STATE / "supervisor.pid"
    if pid_file.exists() and not _stop_supervisor(int(pid_file.read_text())):
        print(f"the cluster's supervisor (pid {pid_file.read_text()}) did not stop in {STOP_TIMEOUT} s; "
              f"its log: {CHECKOUT_STATE / 'supervisor.log'}", file=sys.stderr)  # fmt: skip
        return 1
    shutil.rmtree(CHECKOUT_STATE, ignore_errors=True)
    print("the cluster is down")
    return 0


def _stop_supervisor(pid: int) -> bool:
    """SIGTERM the supervisor and wait until it has stopped the cluster; whether it has."""
    if _alive(pid):
        os.kill(pid, 15)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").read_bytes().find(b"tests.cluster") >= 0


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    if command == "up":
        return up(int(argv[1]) if len(argv) > 1 else 3)
    if command == "supervise":
        return supervise(int(argv[1]))
    if command == "airflow-up":
        return airflow_up(Path(argv[1]).resolve() if len(argv) > 1 else REPO / "dags")
    if command == "down":
        return down()
    ready = CHECKOUT_STATE / "ready"
    print(ready.read_text() if ready.exists() else "the cluster is down")
    return 0


__all__ = ["MISSING_IMAGE", "Any", "ApiError", "Cluster", "bin_dir", "built"]
