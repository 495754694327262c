"""The real control plane (tests/cluster, built from source): its start time, the node agent's
pod start latency; side by side on one cluster, submit -> every rank started and the API
requests per job for the plain pods backend, the MPIJob backend under the real mpi-operator and
the Volcano Job backend under real Volcano, with 2 and 8 workers; and the master's log read
through the real apiserver's log proxy by this project's path and by KubernetesPodOperator's
(``PodManager.fetch_container_logs(follow=True)``, as installed), plain and across a restart of
the apiserver mid-stream (the cut only the real system makes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from airflow_mpi.backends.kubernetes import KubernetesBackend  # noqa: E402
from airflow_mpi.job.naming import RunIdentity  # noqa: E402
from airflow_mpi.runner.job import JobRunner  # noqa: E402
from airflow_mpi.runner.retries import plan_for  # noqa: E402
from airflow_mpi.spec import MPIJobSpec  # noqa: E402
from tests.cluster.cluster import Cluster, built  # noqa: E402
from tests.cluster.conftest import api_client  # noqa: E402

PROGRAM = "import os; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], 'started', flush=True)"
BACKENDS = ("pods", "mpijob", "volcano")
# The master prints numbered lines (rank 0 only) at a steady rate, so a restart lands mid-stream.
LINES_PROGRAM = (
    "import os, sys, time\n"
    "sys.stdout.reconfigure(line_buffering=True)  # whole lines: mpiexec tags each read it forwards\n"
    "n, rate = int(sys.argv[1]), float(sys.argv[2])\n"
    "if os.environ['OMPI_COMM_WORLD_RANK'] == '0':\n"
    "    t0 = time.monotonic()\n"
    "    for i in range(n):\n"
    "        print(f'line {i:08d}')\n"
    "        if rate and i % 100 == 99:\n"
    "            sys.stdout.flush(); time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))\n"
)


def counted_client(kubeconfig: Path) -> tuple[Any, list[int]]:
    """A client configured as the backend's, counting every request it sends."""
    client = api_client(kubeconfig)
    count = [0]
    send = client.request

    def counting(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return send(*args, **kwargs)

    client.request = counting
    return client, count


# The node agent runs any image's command on this machine's files; real Nodes run the image's.
AGENT_IMAGE, AGENT_PYTHON = "registry.example/airflow-mpi-train:0.1", sys.executable


def one_job(
    cluster: Cluster, namespace: str, kind: str, workers: int, image: str = AGENT_IMAGE, python: str = AGENT_PYTHON
) -> dict[str, float]:
    client, count = counted_client(cluster.kubeconfig)
    backend = KubernetesBackend(kind=kind, api_client=client, namespace=namespace)
    spec = MPIJobSpec.from_dict({
        "name": "bench", "image": image,
        "command": [python, "-c", PROGRAM], "workers": {"replicas": workers},
        "startup_timeout": 120, "timeout": 120,
    })  # fmt: skip
    identity = RunIdentity("bench", kind, uuid.uuid4().hex[:8])
    plan = plan_for(backend, spec, identity)
    ranks = workers + 1
    seen: set[str] = set()
    all_started: list[float] = []
    started = time.monotonic()

    def emit(text: str) -> None:
        for line in text.splitlines():
            if " started" in line and "rank " in line:
                seen.add(line.split("rank ", 1)[1].split()[0])
                if len(seen) == ranks and not all_started:
                    all_started.append(time.monotonic() - started)

    JobRunner(backend, plan, emit).run()
    total = time.monotonic() - started
    return {"ranks_started": all_started[0] if all_started else float("nan"), "requests": count[0], "total": total}


def pod_start_latency(cluster: Cluster, namespace: str, runs: int, image: str = "registry.example/x:1") -> float:
    """A bare pod (``true``): create -> its Node reports it ran (scheduler + node agent or kubelet)."""
    api = cluster.api()
    times = []
    for i in range(runs):
        name = f"latency-{i}"
        container = {"name": "c", "image": image, "command": ["true"]}
        spec = {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [container]}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        started = time.monotonic()
        api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
        api.wait(
            name,
            lambda n=name: api.get(f"/api/v1/namespaces/{namespace}/pods/{n}")["status"].get("phase") == "Succeeded",
            60,
            0.02,
        )
        times.append(time.monotonic() - started)
        api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return sorted(times)[len(times) // 2]


LOG_IMAGE = [AGENT_IMAGE, AGENT_PYTHON]  # what the log jobs run: real_nodes.py points it at the image


def log_job(cluster: Cluster, namespace: str, lines: int, rate: float) -> tuple[KubernetesBackend, Any]:
    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
    image, python = LOG_IMAGE
    spec = MPIJobSpec.from_dict({
        "name": "logs", "image": image,
        "command": [python, "-c", LINES_PROGRAM, str(lines), str(rate)], "workers": {"replicas": 1},
        "startup_timeout": 120, "timeout": 600,
    })  # fmt: skip
    return backend, plan_for(backend, spec, RunIdentity("bench", "logs", uuid.uuid4().hex[:8]))


def task_logger(name: str) -> tuple[logging.Logger, Any]:
    from k8s_double import CountingHandler

    handler = CountingHandler()
    handler.keep = True
    logger = logging.getLogger(f"bench.real.{name}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, handler


def restart_when(handler: Any, cluster: Cluster, at_line: int, restarts: list[float]) -> threading.Thread:
    """Restart the apiserver once ``at_line`` lines reached the logger (the stream is cut)."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(handler.arrivals) < at_line:
            time.sleep(0.01)
        t0 = time.monotonic()
        cluster.plane.restart_apiserver()
        restarts.append(time.monotonic() - t0)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def logs_ours(cluster: Cluster, namespace: str, lines: int, rate: float, restart: bool) -> Any:
    from kpo_logs import tally

    logger, handler = task_logger("ours")
    backend, plan = log_job(cluster, namespace, lines, rate)
    restarts: list[float] = []
    thread = restart_when(handler, cluster, lines // 3, restarts) if restart else None
    JobRunner(backend, plan, lambda text: logger.info("%s", text)).run()
    if thread is not None:
        thread.join()
    return tally(handler, lines)


def logs_kpo(cluster: Cluster, namespace: str, lines: int, rate: float, restart: bool) -> Any:
    """Our backend makes and starts the job; PodManager follows the master's log, as the
    KubernetesPodOperator does (the task's logger given to it, as Airflow gives each task one)."""
    from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager
    from kpo_logs import tally
    from kubernetes import client

    logger, handler = task_logger("kpo")
    backend, plan = log_job(cluster, namespace, lines, rate)
    runner = JobRunner(backend, plan, lambda _text: None)
    restarts: list[float] = []
    try:
        runner.create()
        runner.wait_ready()
        runner.start_master()
        core = client.CoreV1Api(backend.api_client)
        pod = core.read_namespaced_pod(plan.master.name, namespace)
        manager = PodManager(kube_client=core)
        manager._log = logger
        asyncio.run(manager.await_pod_start(pod))  # as the operator does before it reads the log
        thread = restart_when(handler, cluster, lines // 3, restarts) if restart else None
        manager.fetch_container_logs(pod, pod.spec.containers[0].name, follow=True)
        if thread is not None:
            thread.join()
    finally:
        runner.teardown()
    return tally(handler, lines)


def kpo_comparison(cluster: Cluster, namespace: str, quick: bool) -> dict[str, Any]:
    """Lines/s into the task logger (as fast as the master prints), then lost and duplicated
    lines across an apiserver restart (the master printing 2,000 lines/s)."""
    lines = 20_000 if quick else 100_000
    cut_lines, cut_rate = (6_000, 2_000.0) if quick else (20_000, 2_000.0)
    results: dict[str, Any] = {}
    for name, read in (("airflow-mpi", logs_ours), ("KubernetesPodOperator", logs_kpo)):
        results[name] = {
            "plain": read(cluster, namespace, lines, 0.0, restart=False).__dict__,
            "apiserver_restart": read(cluster, namespace, cut_lines, cut_rate, restart=True).__dict__,
        }
    return results


def measure(quick: bool) -> dict[str, Any]:
    if not built(("etcd", "kubernetes", "mpi-operator", "volcano")):
        raise RuntimeError("the control plane is not built: run `make cluster-build`")
    root = Path("/var/tmp/airflow-mpi-bench")
    root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="cluster-", dir=root)))
    results: dict[str, Any] = {}
    try:
        cluster.start()
        results["control_plane_start"] = cluster.timings["control plane"]
        results["nodes_ready"] = cluster.timings["cluster"]
        t0 = time.monotonic()
        cluster.controller("mpi-operator")
        results["mpi_operator_start"] = time.monotonic() - t0
        t0 = time.monotonic()
        cluster.controller("volcano")
        results["volcano_start"] = time.monotonic() - t0
        namespace = "bench"
        cluster.create_namespace(namespace)
        results["pod_start_latency"] = pod_start_latency(cluster, namespace, 3 if quick else 7)
        for workers in (2,) if quick else (2, 8):
            for kind in BACKENDS:
                results[f"{kind}_{workers}"] = one_job(cluster, namespace, kind, workers)
        results["logs"] = kpo_comparison(cluster, namespace, quick)
        cluster.delete_namespace(namespace)
    finally:
        cluster.stop()
        with contextlib.suppress(OSError):
            root.rmdir()  # only if empty
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(measure("--quick" in sys.argv), indent=2))
