"""Real Kubernetes Nodes on this machine: per Node a real kubelet with its own containerd (and
Debian's runc), the CNI reference plugins with a pod subnet of its own; one kube-proxy
(nftables) and CoreDNS as the cluster DNS. Every binary is built from upstream source
(tests/cluster/build.py); the images come from tests/cluster/image.py.

The layout, all of it made here and removed by ``stop``:
- a port-less bridge ``amnode0`` (this kernel has no dummy links) holding each Node's address (10.201.0.<i+1>), CoreDNS's (10.201.0.53)
  and the apiserver relay's (10.201.0.254: the ``kubernetes`` Service's endpoint, so pods reach the apiserver);
- per Node a bridge ``amnbr<i>`` (made by the CNI bridge plugin) for pod subnet 10.244.<i>.0/24;
  pods of different Nodes reach each other through the host's routes, as nodes on one L3 network;
- per Node a cgroup ``/airflow-mpi-node-<i>`` in each cgroup v1 hierarchy (the kubelet's cgroupRoot);
- per Node a containerd root copied from a prepared image store by hard links (one import of the
  images per image set, cached), so starting Nodes costs seconds, not a 5 GB unpack each;
- the kernel settings the kubelet and the CNI plugins change, restored at the end;
- the nftables tables kube-proxy and the portmap plugin make, deleted at the end.

Two settings this machine needs: ``failCgroupV1: false`` (cgroup v1; the kubelet refuses to
start otherwise) and containerd's ``restrict_oom_score_adj`` (no CAP_SYS_RESOURCE: nothing may
lower its oom_score_adj).

Test code: nothing here ships in the wheel.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from airflow_mpi.backends.sandbox import NETNS_PREFIX as LOCAL_NETNS_PREFIX
from tests.cluster.build import COMPONENTS, K8S_VERSION, bin_dir
from tests.cluster.controlplane import ControlPlane, Process, free_port, wait_for

DUMMY_LINK = "amnode0"
BRIDGE_PREFIX = "amnbr"
NODE_NET = "10.201.0"
DNS_ADDRESS = f"{NODE_NET}.53"
# Where pods reach the apiserver: the ``kubernetes`` Service's endpoint, a relay to loopback
# (tests/cluster/apiserver_relay.py).
APISERVER_RELAY = (f"{NODE_NET}.254", 6443)
CLUSTER_DNS_IP = "10.0.0.10"  # the kube-dns Service's ClusterIP, in the control plane's service range
POD_CIDR = "10.244.0.0/16"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PAUSE_IMAGE = "localhost/pause:3.10"
RUNC = "/usr/sbin/runc"
# What the kubelet, kube-proxy and the CNI bridge plugin change on the host, restored at stop.
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.netfilter.nf_conntrack_max",
)
STATE_ROOT = Path("/run/airflow-mpi-nodes")
NODE_STORE_CACHE = Path.home() / ".cache" / "airflow-mpi" / "node-store"


def node_binary(component: str, name: str) -> str:
    return str(bin_dir(COMPONENTS[component]) / name)


def node_tools_built() -> bool:
    from tests.cluster.build import NODE_TIER, is_built

    return all(is_built(COMPONENTS[name]) for name in NODE_TIER) and Path(RUNC).exists()


def _sh(*argv: str, check: bool = True, timeout: float = 120) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def read_sysctls() -> dict[str, str]:
    values = {}
    for key in SYSCTLS:
        path = Path("/proc/sys") / key.replace(".", "/")
        with contextlib.suppress(OSError):
            values[key] = path.read_text().strip()
    return values


def write_sysctls(values: dict[str, str]) -> None:
    for key, value in values.items():
        path = Path("/proc/sys") / key.replace(".", "/")
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)


def nft_tables() -> set[str]:
    out = _sh("nft", "list", "tables", check=False)
    return {line.removeprefix("table ").strip() for line in out.splitlines() if line.startswith("table ")}


def host_state() -> dict[str, object]:
    """What real Nodes could leave on the host, for a before/after comparison."""
    links = sorted(p.name for p in Path("/sys/class/net").iterdir())
    # The local sandbox's namespaces (the other tiers', running beside this one) are theirs to check.
    netns = [line.split()[0] for line in _sh("ip", "netns", "list", check=False).splitlines() if line.strip()]
    netns = [name for name in netns if not name.startswith(LOCAL_NETNS_PREFIX)]
    mounts = sorted(
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if any(mark in line for mark in ("airflow-mpi-node", "airflow-mpi-tests", "/run/containerd", "k8s.io"))
    )
    cgroups = sorted(
        str(p) for h in CGROUP_ROOT.iterdir() if h.is_dir() for p in h.glob("airflow-mpi-node-*")
    ) + sorted(str(p) for h in CGROUP_ROOT.iterdir() if h.is_dir() for p in h.glob("k8s.io"))
    processes = []
    names = {"kubelet", "containerd", "kube-proxy", "coredns", "containerd-shim", "containerd-shim-runc-v2", "pause"}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                comm = (proc / "comm").read_text().strip()
                if comm in names or comm.startswith("containerd-shim"):
                    processes.append(f"{proc.name} {comm}")
    return {
        "links": [x for x in links if x.startswith((DUMMY_LINK, BRIDGE_PREFIX, "veth"))],
        "netns": sorted(netns),
        "mounts": mounts,
        "cgroups": cgroups,
        "processes": sorted(processes),
        "nftables": sorted(nft_tables()),
        "sysctls": read_sysctls(),
    }


# --- the image store: images imported once into a containerd root, copied per Node by hard links


def _store_key(archives: list[Path]) -> str:
    h = hashlib.sha256(COMPONENTS["containerd"].version.encode())
    for archive in sorted(archives):
        st = archive.stat()
        h.update(f"{archive}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _containerd_config(root: Path, state: Path, socket_path: Path, cni_conf: Path, runc_root: Path) -> str:
    cri = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket_path}"
[metrics]
  address = ""
[plugins.'io.containerd.internal.v1.opt']
  path = "{root}/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{cri}]
  # No CAP_SYS_RESOURCE here: runc may not lower oom_score_adj below the runtime's own.
  restrict_oom_score_adj = true
  [{cri}.cni]
    bin_dirs = ["{bin_dir(COMPONENTS["cni-plugins"])}"]
    conf_dir = "{cni_conf}"
  [{cri}.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [{cri}.containerd.runtimes.runc.options]
      BinaryName = "{RUNC}"
      Root = "{runc_root}"
      SystemdCgroup = false
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
"""


def _containerd_env() -> dict[str, str]:
    # containerd finds its shim on PATH.
    path = f"{bin_dir(COMPONENTS['containerd'])}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return dict(os.environ, PATH=path)


def _ctr(socket_path: Path, *args: str, timeout: float = 600) -> str:
    return _sh(node_binary("containerd", "ctr"), "--address", str(socket_path), "--namespace", "k8s.io", *args,
               timeout=timeout)  # fmt: skip


def image_store(archives: list[Path], workdir: Path, log=print) -> tuple[Path, float]:
    """A containerd root with ``archives`` imported, cached by their identity; returns its path
    and the seconds importing took (0 when cached)."""
    store = NODE_STORE_CACHE / _store_key(archives)
    if (store / ".complete").exists():
        return store / "root", 0.0
    shutil.rmtree(NODE_STORE_CACHE, ignore_errors=True)  # older image sets: gigabytes each
    started = time.monotonic()
    run = workdir / "store"
    socket_path = run / "containerd.sock"
    config = run / "config.toml"
    run.mkdir(parents=True, exist_ok=True)
    (run / "cni").mkdir(exist_ok=True)
    config.write_text(_containerd_config(store / "root", run / "state", socket_path, run / "cni", run / "runc"))
    process = Process("containerd-store", [node_binary("containerd", "containerd"), "--config", str(config)],
                      run / "containerd.log", env=_containerd_env())  # fmt: skip
    process.start()
    try:
        wait_for("the image store's containerd", socket_path.exists, 60, process)
        for archive in archives:
            t0 = time.monotonic()
            _ctr(socket_path, "images", "import", "--snapshotter", "overlayfs", str(archive))
            log(f"nodes: imported {archive.parent.name} in {time.monotonic() - t0:.0f} s")
    finally:
        process.stop(grace=30)
        shutil.rmtree(run, ignore_errors=True)
    seconds = time.monotonic() - started
    (store / ".complete").write_text(json.dumps({"seconds": seconds}))
    return store / "root", seconds


def copy_store(store: Path, target: Path) -> None:
    """The store's tree by hard links (image layers are never written in place), but its bolt
    databases, which each containerd writes: those are copied."""
    _sh("cp", "-al", str(store), str(target))
    for db in target.rglob("*.db"):
        data = db.read_bytes()
        db.unlink()
        db.write_bytes(data)


# --- DNS readiness: one A query, by hand (no resolver library in the test dependencies)


def dns_answers(server: str, name: str, timeout: float = 1.0) -> list[str]:
    """The A records ``server`` gives for ``name`` (empty on NXDOMAIN or no answer)."""
    query_id = int.from_bytes(os.urandom(2), "big")
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.rstrip(".").split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + question + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, 53))
        data = sock.recv(4096)
    _, _, _, an, _, _ = struct.unpack(">HHHHHH", data[:12])
    offset = 12 + len(question) + 4
    answers = []
    for _ in range(an):
        while True:  # the name: labels or a pointer
            if data[offset] & 0xC0 == 0xC0:
                offset += 2
                break
            if data[offset] == 0:
                offset += 1
                break
            offset += data[offset] + 1
        rtype, _, _, length = struct.unpack(">HHIH", data[offset : offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            answers.append(socket.inet_ntoa(data[offset : offset + 4]))
        offset += length
    return answers


# --- one Node


@dataclass
class Node:
    index: int
    name: str
    address: str
    workdir: Path
    state: Path
    kubelet: Process | None = None
    containerd: Process | None = None

    @property
    def socket(self) -> Path:
        return self.state / "containerd.sock"

    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.index}"

    @property
    def subnet(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def cgroup_name(self) -> str:
        return f"airflow-mpi-node-{self.index}"

    def crictl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        endpoint = f"unix://{self.socket}"
        return _sh(node_binary("cri-tools", "crictl"), "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
                   "--timeout", "30s", *args, check=check, timeout=timeout)  # fmt: skip

    def pods(self) -> list[dict]:
        """The pod sandboxes this Node's runtime holds."""
        if not self.socket.exists():
            return []
        return json.loads(self.crictl("pods", "-o", "json") or "{}").get("items") or []

    def containers(self) -> list[dict]:
        if not self.socket.exists():
            return []
        return json.loads(self.crictl("ps", "-a", "-o", "json") or "{}").get("containers") or []


class RealNodes:
    """``count`` real Nodes of ``plane``, with kube-proxy and CoreDNS."""

    def __init__(self, plane: ControlPlane, workdir: Path, count: int, images: list[Path], log=print) -> None:
        self.plane = plane
        self.workdir = workdir
        self.images = images
        self.log = log
        self.state = STATE_ROOT / f"{os.getpid()}-{workdir.name}"
        self.nodes = [
            Node(i, f"node-{i}", f"{NODE_NET}.{i + 1}", workdir / f"node-{i}", self.state / f"node-{i}")
            for i in range(count)
        ]
        self.processes: dict[str, Process] = {}
        self.timings: dict[str, float] = {}
        self._sysctls: dict[str, str] = {}
        self._tables: set[str] = set()
        self._made_dummy = False

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        self._sysctls = read_sysctls()
        self._tables = nft_tables()
        try:
            store, self.timings["image import"] = image_store(self.images, self.workdir, self.log)
            self._host_network()
            self._start_coredns()
            self._start_apiserver_relay()
            for node in self.nodes:
                self._start_containerd(node, store)
            for node in self.nodes:
                self._start_kubelet(node)
            self._start_kube_proxy()
            self._cluster_objects()
            self.timings["nodes"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Pods first (through each runtime, as the kubelet would: CNI teardown included), then
        every process, mounts, links, nftables tables, cgroups, sysctls, directories."""
        for node in self.nodes:
            if node.kubelet is not None:
                node.kubelet.stop(grace=15)
                node.kubelet = None
        for node in self.nodes:
            self._remove_pods(node)
        for name in reversed(list(self.processes)):
            self.processes[name].stop(grace=15)
        self.processes.clear()
        for node in self.nodes:
            if node.containerd is not None:
                node.containerd.stop(grace=30)
                node.containerd = None
        self._unmount_below(self.workdir)
        self._unmount_below(self.state)
        for node in self.nodes:
            _sh("ip", "link", "delete", node.bridge, check=False)
            self._remove_cgroups(node)
        for table in nft_tables() - self._tables:
            _sh("nft", "delete", "table", *table.split(), check=False)
        if self._made_dummy:
            _sh("ip", "link", "delete", DUMMY_LINK, check=False)
            self._made_dummy = False
        if self._sysctls:
            write_sysctls(self._sysctls)
        shutil.rmtree(self.state, ignore_errors=True)
        with contextlib.suppress(OSError):
            STATE_ROOT.rmdir()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- pieces --------------------------------------------------------------------------

    def _host_network(self) -> None:
        if not Path(f"/sys/class/net/{DUMMY_LINK}").exists():
            _sh("ip", "link", "add", DUMMY_LINK, "type", "bridge")  # no dummy module in this kernel
            self._made_dummy = True
        for address in [n.address for n in self.nodes] + [DNS_ADDRESS, APISERVER_RELAY[0]]:
            _sh("ip", "addr", "replace", f"{address}/32", "dev", DUMMY_LINK)
        _sh("ip", "link", "set", DUMMY_LINK, "up")

    def _start_coredns(self) -> None:
        folder = self.workdir / "coredns"
        folder.mkdir(parents=True, exist_ok=True)
        # The kubernetes plugin answers the cluster's names (headless Services' pod records
        # included); nothing is forwarded: no query leaves the machine.
        (folder / "Corefile").write_text(
            f".:53 {{\n  bind {DNS_ADDRESS}\n  errors\n"
            f"  kubernetes cluster.local in-addr.arpa ip6.arpa {{\n"
            f"    kubeconfig {self.plane.admin_kubeconfig}\n    pods insecure\n"
            f"    fallthrough in-addr.arpa ip6.arpa\n  }}\n}}\n"
        )
        process = self._spawn("coredns", [node_binary("coredns", "coredns"), "-conf", str(folder / "Corefile")])

        def answers() -> bool:
            with contextlib.suppress(OSError):
                return dns_answers(DNS_ADDRESS, "kubernetes.default.svc.cluster.local") != []
            return False

        wait_for("CoreDNS", answers, 60, process)

    def _start_apiserver_relay(self) -> None:
        host, port = APISERVER_RELAY
        target = self.plane.server.removeprefix("https://").rsplit(":", 1)
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        process = self._spawn("apiserver-relay", [sys.executable, "-m", "tests.cluster.apiserver_relay", host,
                                                  str(port), target[0], target[1]], env=env)  # fmt: skip

        def listening() -> bool:
            with socket.create_connection((host, port), timeout=1):
                return True

        wait_for("the apiserver relay", listening, 30, process)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        process = Process(name, argv, self.workdir / "logs" / f"{name}.log", env=env)
        process.start()
        self.processes[name] = process
        return process

    def _start_containerd(self, node: Node, store: Path) -> None:
        node.workdir.mkdir(parents=True, exist_ok=True)
        node.state.mkdir(parents=True, exist_ok=True)
        copy_store(store, node.workdir / "containerd")
        cni = node.workdir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-bridge.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": f"airflow-mpi-{node.name}",
            "plugins": [
                {"type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": node.subnet}]], "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": str(node.workdir / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables"},
            ],
        }))  # fmt: skip
        config = node.workdir / "containerd.toml"
        runc_root = node.state / "runc"
        config.write_text(
            _containerd_config(node.workdir / "containerd", node.state / "containerd", node.socket, cni, runc_root)
        )
        node.containerd = Process(f"containerd-{node.name}", [node_binary("containerd", "containerd"), "--config",
                                  str(config)], self.workdir / "logs" / f"containerd-{node.name}.log",
                                  env=_containerd_env())  # fmt: skip
        node.containerd.start()
        wait_for(f"{node.name}'s containerd", node.socket.exists, 60, node.containerd)

    def _make_cgroups(self, node: Node) -> None:
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            if not hierarchy.is_dir() or hierarchy.name == "unified" or not (hierarchy / "cgroup.procs").exists():
                continue
            path = hierarchy / node.cgroup_name
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (path / key).write_text((hierarchy / key).read_text())

    def _remove_cgroups(self, node: Node) -> None:
        """The Node's cgroup root in every hierarchy, deepest first (the kubelet's kubepods tree)."""
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            root = hierarchy / node.cgroup_name
            if not root.is_dir():
                continue
            for child in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    child.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()

    def _start_kubelet(self, node: Node) -> None:
        self._make_cgroups(node)
        kubeconfig, serving = self.plane.node_credentials(node.name, node.address)
        (node.workdir / "resolv.conf").write_text("# the pods' upstream resolver: none (nothing leaves the machine)\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": node.address,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.plane.pki_dir / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            # This machine has cgroup v1 controllers; v1.35+ refuses them unless told.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{node.cgroup_name}",
            "containerRuntimeEndpoint": f"unix://{node.socket}",
            "clusterDNS": [CLUSTER_DNS_IP],
            "clusterDomain": "cluster.local",
            "resolvConf": str(node.workdir / "resolv.conf"),
            "podLogsDir": str(node.workdir / "pod-logs"),
            # Images are imported, never pulled: never collect them; evict only when truly short.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1Gi", "imagefs.available": "1Gi",
                             "nodefs.inodesFree": "1%", "imagefs.inodesFree": "1%"},
            "serializeImagePulls": False,
            "maxPods": 110,
        }  # fmt: skip
        path = node.workdir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        node.kubelet = Process(f"kubelet-{node.name}", [
            node_binary("kubernetes-node", "kubelet"), f"--config={path}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={node.workdir / 'kubelet'}", f"--cert-dir={node.workdir / 'pki'}",
            f"--hostname-override={node.name}", f"--node-ip={node.address}", "--v=1",
        ], self.workdir / "logs" / f"kubelet-{node.name}.log")  # fmt: skip
        node.kubelet.start()

    def restart_kubelet(self, node: Node) -> None:
        if node.kubelet is not None and node.kubelet.alive:
            return
        node.kubelet = None
        self._start_kubelet(node)

    def stop_kubelet(self, node: Node) -> None:
        """The kubelet only (its pods go on running, as when a node's agent dies)."""
        if node.kubelet is not None:
            node.kubelet.stop(grace=10)

    def _start_kube_proxy(self) -> None:
        assert self.plane.pki is not None
        pair = self.plane.pki.issue("kube-proxy", "system:kube-proxy")
        kubeconfig = self.plane.pki.kubeconfig(self.workdir / "kube-proxy.kubeconfig", self.plane.server,
                                               "kube-proxy", pair=pair)  # fmt: skip
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": self.nodes[0].name,
            "clusterCIDR": POD_CIDR,
            "bindAddress": self.nodes[0].address,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE here to lower it
            # Leave the machine's conntrack settings as they are.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "nodePortAddresses": [f"{self.nodes[0].address}/32"],
        }
        path = self.workdir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kube-proxy", [node_binary("kubernetes-node", "kube-proxy"), f"--config={path}", "--v=1"])

    def _cluster_objects(self) -> None:
        """What a cluster installer (kubeadm) adds for its nodes: the apiserver's right to call
        the kubelets (logs, exec), and the cluster DNS as pods see it: Service kube-dns
        (ClusterIP 10.0.0.10, what the kubelets write into each pod's resolv.conf) whose endpoint
        is CoreDNS's address; kube-proxy routes one to the other."""
        from tests.cluster.kubeapi import KubeApi

        api = KubeApi(self.plane.admin_kubeconfig)
        rbac = "rbac.authorization.k8s.io"
        api.apply_object(f"/apis/{rbac}/v1/clusterrolebindings", {
            "apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kube-apiserver-kubelet-api-admin"},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
            "subjects": [{"apiGroup": rbac, "kind": "User", "name": "kube-apiserver-kubelet-client"}],
        })  # fmt: skip
        ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
        api.apply_object("/api/v1/namespaces/kube-system/services", {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
            "spec": {"clusterIP": CLUSTER_DNS_IP, "ports": ports},
        })  # fmt: skip
        api.apply_object("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kube-dns-coredns", "labels": {
                "kubernetes.io/service-name": "kube-dns", "endpointslice.kubernetes.io/managed-by": "airflow-mpi-tests"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [DNS_ADDRESS], "conditions": {"ready": True}}],
            "ports": ports,
        })  # fmt: skip
        # The apiserver reconciles no endpoints (it advertises loopback): the ``kubernetes``
        # Service's endpoint is the relay, as a load balancer in front of the apiservers would be.
        api.apply_object("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes-relay", "labels": {
                "kubernetes.io/service-name": "kubernetes", "endpointslice.kubernetes.io/managed-by": "airflow-mpi-tests"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [APISERVER_RELAY[0]], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": APISERVER_RELAY[1], "protocol": "TCP"}],
        })  # fmt: skip

    def _remove_pods(self, node: Node) -> None:
        """Every sandbox of this Node's runtime, stopped (CNI DEL: its veth and IP go) and removed."""
        if node.containerd is None or not node.containerd.alive:
            return
        with contextlib.suppress(Exception):
            ids = node.crictl("pods", "-q").split()
            for pod in ids:
                node.crictl("stopp", pod, check=False)
                node.crictl("rmp", "-f", pod, check=False)

    @staticmethod
    def _unmount_below(root: Path) -> None:
        prefix = str(root)
        mounts = [
            line.split()[1].encode().decode("unicode_escape")
            for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(prefix)
        ]
        for mount in sorted(mounts, key=len, reverse=True):
            _sh("umount", "-l", mount, check=False)

    # --- for tests -----------------------------------------------------------------------

    def running_pods(self) -> list[str]:
        """``namespace/name`` of every pod sandbox still up (SANDBOX_READY) in any Node's runtime."""
        return sorted(
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for node in self.nodes
            for p in node.pods()
            if p.get("state") == "SANDBOX_READY"
        )

    def runtime_objects(self) -> list[str]:
        """Every sandbox and container any Node's runtime still holds, stopped ones included
        (the kubelet's garbage collection removes those of deleted pods within about a minute)."""
        found = []
        for node in self.nodes:
            found += [f"{node.name} sandbox {p['metadata']['namespace']}/{p['metadata']['name']}" for p in node.pods()]
            found += [f"{node.name} container {c['metadata']['name']} ({c['state']})" for c in node.containers()]
        return sorted(found)

    def running_containers(self, namespace: str) -> list[str]:
        """The containers of ``namespace``'s pods still running in any Node's runtime."""
        return sorted(
            f"{node.name}: {c['labels'].get('io.kubernetes.pod.name')}/{c['metadata']['name']}"
            for node in self.nodes
            for c in node.containers()
            if c.get("state") == "CONTAINER_RUNNING"
            and c.get("labels", {}).get("io.kubernetes.pod.namespace") == namespace
        )

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)


__all__ = ["K8S_VERSION", "RealNodes", "host_state", "node_tools_built"]
