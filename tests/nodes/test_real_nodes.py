"""Jobs on real Nodes: every pod a container of the training image (docker/Dockerfile, built by
buildah) in a real kubelet's containerd and runc, its network from the CNI bridge plugin, its
peers' names from CoreDNS. The pods backend; the real scheduler spreads the three pods over the
three Nodes."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.kinds.tolerations import NODE_LOST_TOLERATION_SECONDS
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import TRAINS_FOREVER, Log, api_client, job_objects, run_evicting_a_worker, when_logged
from tests.cluster.image import BASE_IMAGE, TRAIN_IMAGE

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

# mpi4py's hello world, with what each rank sees of where it runs.
HELLO = (
    "from mpi4py import MPI; import json, socket; c = MPI.COMM_WORLD\n"
    "print(f'Hello, World! I am process {c.rank} of {c.size} on {socket.gethostname()}', flush=True)\n"
    "import os; shm = os.statvfs('/dev/shm')\n"
    "seen = c.gather({'host': socket.gethostname(), 'fqdn': socket.getfqdn(), 'ip': socket.gethostbyname(socket.gethostname()),\n"
    "                 'node': open('/etc/hostname').read().strip(), 'shm': shm.f_blocks * shm.f_frsize})\n"
    "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'size': c.size, 'sum': c.allreduce(c.rank + 1), 'seen': seen}))\n"
    "else: c.allreduce(c.rank + 1)\n"
)


def make_plan(workers: int = 2, workers_memory: str | None = None, **fields: Any) -> JobPlan:
    data: dict[str, Any] = {
        "name": "nodes",
        "image": TRAIN_IMAGE,
        "command": ["python", "-c", HELLO],
        "workers": {"replicas": workers, **({"memory": workers_memory} if workers_memory else {})},
        "startup_timeout": 90,
        "timeout": 180,
    }
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), RunIdentity("nodesdag", "train", f"run-{time.monotonic_ns()}"))


def backend_for(cluster: Cluster, namespace: str) -> KubernetesBackend:
    return KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)


def failure(cluster: Cluster, namespace: str, plan: JobPlan, error: type[Exception] = JobFailed) -> tuple[str, float]:
    """Run the job expecting ``error``: its message and the seconds until it came."""
    started = time.monotonic()
    with pytest.raises(error) as caught:
        JobRunner(backend_for(cluster, namespace), plan, Log()).run()
    return str(caught.value), time.monotonic() - started


def pod_nodes(cluster: Cluster, namespace: str, job: str) -> dict[str, str]:
    pods = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"airflow-mpi.io/job={job}")
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in pods["items"]}


def test_hello_world_runs_one_rank_per_node_with_names_from_coredns(cluster: Cluster, namespace: str) -> None:
    backend = backend_for(cluster, namespace)
    plan = make_plan(workers=2, pod={"shm_size": "256Mi"})
    log = Log()
    placed: dict[str, str] = {}

    def note_placement(line: str) -> None:
        log(line)
        if "Hello, World!" in line and not placed:
            placed.update(pod_nodes(cluster, namespace, plan.job_name))

    result = JobRunner(backend, plan, note_placement).run()
    assert result.exit_code == 0, log
    assert result.result["size"] == 3 and result.result["sum"] == 6
    job = plan.job_name
    assert sorted(seen["host"] for seen in result.result["seen"]) == sorted(
        [f"{job}-master-0", f"{job}-worker-0", f"{job}-worker-1"]
    )
    # Three pods on three real Nodes, each rank in its own pod's network (a pod IP of its Node's subnet).
    assert sorted(placed.values()) == ["node-0", "node-1", "node-2"], placed
    assert all(seen["ip"].startswith("10.244.") for seen in result.result["seen"]), result.result["seen"]
    assert len({seen["ip"] for seen in result.result["seen"]}) == 3
    # pod.shm_size: the kubelet sizes the memory-backed /dev/shm of every pod to it.
    assert [seen["shm"] for seen in result.result["seen"]] == [256 << 20] * 3, result.result["seen"]
    assert sum("Hello, World! I am process" in line for line in log) == 3
    assert backend.leftovers(job) == []
    assert job_objects(cluster.api(), namespace) == []


def test_a_rank_that_exits_3_ends_the_job_and_is_named(cluster: Cluster, namespace: str) -> None:
    program = "from mpi4py import MPI; import sys\nif MPI.COMM_WORLD.rank == 2: sys.exit(3)\nMPI.COMM_WORLD.Barrier()\n"
    plan = make_plan(workers=2, command=["python", "-m", "mpi4py", "-c", program])
    message, seconds = failure(cluster, namespace, plan)
    assert seconds < 120, message
    assert f"rank 2 on pod {plan.job_name}-worker-1 exited with code 3" in message, message


def test_an_image_without_sshd_is_named_not_timed_out(cluster: Cluster, namespace: str) -> None:
    plan = make_plan(workers=1, image=BASE_IMAGE, startup_timeout=120)
    message, seconds = failure(cluster, namespace, plan)
    assert seconds < 90, message
    assert "sshd" in message, message


def test_an_image_not_on_the_node_is_named(cluster: Cluster, namespace: str) -> None:
    plan = make_plan(workers=1, image="localhost/airflow-mpi-absent:1", pod={"image_pull_policy": "Never"})
    message, seconds = failure(cluster, namespace, plan)
    assert seconds < 60, message
    assert "ErrImageNeverPull" in message and "localhost/airflow-mpi-absent:1" in message, message


def test_the_job_timeout_ends_it_on_real_nodes(cluster: Cluster, namespace: str) -> None:
    program = "import time\nprint('training', flush=True)\ntime.sleep(600)\n"
    plan = make_plan(workers=1, command=["python", "-c", program], timeout=20)
    message, seconds = failure(cluster, namespace, plan, JobTimeout)
    assert seconds < 90, message
    assert "timeout of 20s" in message, message


def test_a_job_without_root_in_a_restricted_namespace(cluster: Cluster) -> None:
    """sshd and every rank as uid 1000 with every capability dropped, admitted by the real
    PodSecurity admission at ``restricted`` and run by real runc with seccomp RuntimeDefault."""
    namespace = f"r-{time.monotonic_ns() % 10**8}"
    cluster.create_namespace(namespace, labels={"pod-security.kubernetes.io/enforce": "restricted"})
    try:
        program = (
            "from mpi4py import MPI; import json, os; c = MPI.COMM_WORLD\n"
            "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]\n"
            "seen = c.gather({'uid': os.getuid(), 'caps': caps})\n"
            "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps(seen))\n"
        )
        plan = make_plan(workers=2, command=["python", "-c", program], ssh_port=2222, pod={"run_as_user": 1000})
        log = Log()
        result = JobRunner(backend_for(cluster, namespace), plan, log).run()
        assert result.exit_code == 0, log
        assert result.result == [{"uid": 1000, "caps": "0000000000000000"}] * 3, result.result
    finally:
        cluster.delete_namespace(namespace, wait=0)


def test_a_worker_evicted_through_the_eviction_api_ends_the_job_naming_it(cluster: Cluster, namespace: str) -> None:
    plan = make_plan(workers=2, command=["python", "-c", TRAINS_FOREVER])
    failure, victim = run_evicting_a_worker(cluster, namespace, backend_for(cluster, namespace), plan)
    assert victim in str(failure), str(failure)


@pytest.mark.parametrize("moment", ["training", "before Ready"])
def test_a_worker_whose_kubelet_stops_ends_the_job_naming_its_node(
    cluster: Cluster, namespace: str, moment: str
) -> None:
    """The worker's Node stops reporting (its kubelet stopped; its containers run on): once the
    Node's grace period is over (40 s here) the job ends with the pod and the Node named, not at
    its timeout. While it trains, the node lifecycle controller marks the Ready pod not ready;
    before the kubelet reported it Ready, the taint eviction controller's deletion (the pods
    tolerate a lost Node 20 s) is the only mark it gets."""
    assert cluster.real is not None
    real = cluster.real
    plan = make_plan(workers=2, command=["python", "-c", TRAINS_FOREVER], timeout=600)
    log = Log()
    stopped: list[tuple[str, float, bool]] = []
    worker = f"{plan.job_name}-worker-1"

    def stop_the_workers_kubelet() -> None:
        path = f"/api/v1/namespaces/{namespace}/pods/{worker}"
        deadline = time.monotonic() + 90
        while moment == "before Ready" and time.monotonic() < deadline:  # bound to its Node, not Ready
            with contextlib.suppress(Exception):
                if cluster.api().get(path)["spec"].get("nodeName"):
                    break
            time.sleep(0.02)
        node_name = pod_nodes(cluster, namespace, plan.job_name)[worker]
        real.stop_kubelet(real.node(node_name))
        conditions = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods/{worker}")["status"].get("conditions")
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions or [])
        stopped.append((node_name, time.monotonic(), ready))

    thread = when_logged(log, "training", stop_the_workers_kubelet, timeout=0 if moment == "before Ready" else 90)
    try:
        with pytest.raises(JobFailed) as caught:
            JobRunner(backend_for(cluster, namespace), plan, log).run()
        ended = time.monotonic()
    finally:
        thread.join()
        for node in real.nodes:  # its pods are deleted once it reports again
            real.restart_kubelet(node)
        # The next test's pods must not land on a Node still marked lost (they would be evicted).
        cluster.wait_nodes_ready(180)
    node_name, at, was_ready = stopped[0]
    message = str(caught.value)
    # A pod of the job on that Node named (the scheduler may put another there before the Node's
    # grace period is over), and the Node.
    assert f"pod {plan.job_name}-" in message and f"Node {node_name}" in message, message
    # The Node's grace period, the pods' toleration of a lost Node (before Ready), then seconds.
    assert ended - at < 40 + NODE_LOST_TOLERATION_SECONDS + 30, ended - at
    if moment == "before Ready":
        assert not was_ready and "NoExecute taint" in message, message


def test_a_rank_over_its_pods_memory_limit_is_killed_by_the_kernel_and_named(cluster: Cluster, namespace: str) -> None:
    """Worker 1's rank allocates past the pod's memory limit: the kernel's OOM killer (the
    container's memory cgroup, set by the real kubelet) kills it with SIGKILL; the job ends at
    once with the rank, its pod and the memory limit named."""
    program = (
        "from mpi4py import MPI; import time; c = MPI.COMM_WORLD\n"
        "if c.rank == 2:\n"
        "    hog = []\n"
        "    while True: hog.append(bytearray(16 << 20))\n"
        "c.Barrier()\n"
    )
    plan = make_plan(workers=2, command=["python", "-c", program], workers_memory="256Mi")
    message, seconds = failure(cluster, namespace, plan)
    assert seconds < 90, message
    assert f"{plan.job_name}-worker-1" in message, message
    assert "memory" in message.lower() and ("137" in message or "signal 9" in message), message


def test_a_killed_airflow_task_leaves_no_container_on_any_node(
    cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cluster.conftest import install_connections, kill_task_once
    from tests.cluster.controlplane import wait_for

    assert cluster.real is not None
    install_connections(monkeypatch, cluster.kubeconfig, namespace, mpi_conn_id="mpi_nodes")
    spec = {"name": "killed", "image": TRAIN_IMAGE, "command": ["python", "-c", TRAINS_FOREVER],
            "workers": {"replicas": 2}, "startup_timeout": 90, "timeout": 600}  # fmt: skip
    # Every rank training: three containers running, one per Node; then the task is killed.
    real = cluster.real
    code, output = kill_task_once(spec, "mpi_nodes", lambda: len(real.running_containers(namespace)) == 3)
    assert code == 143, output[-3000:]
    wait_for("no container of the job running on any Node", lambda: not cluster.real.running_containers(namespace), 60)
    assert job_objects(cluster.api(), namespace) == []
