"""The real control plane (tests/cluster, built from source): its start time, the node agent's
pod start latency, and, side by side on one cluster, submit -> every rank started and the API
requests per job for the plain pods backend and the MPIJob backend under the real mpi-operator,
with 2 and 8 workers."""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_mpi.backends.kubernetes import KubernetesBackend  # noqa: E402
from airflow_mpi.backends.mpijob import MPIJobBackend  # noqa: E402
from airflow_mpi.naming import RunIdentity  # noqa: E402
from airflow_mpi.plan import render_plan  # noqa: E402
from airflow_mpi.runner import JobRunner  # noqa: E402
from airflow_mpi.spec import MPIJobSpec  # noqa: E402
from tests.cluster.cluster import Cluster, built  # noqa: E402
from tests.cluster.conftest import api_client  # noqa: E402

PROGRAM = "import os; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], 'started', flush=True)"


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


def one_job(cluster: Cluster, namespace: str, kind: str, workers: int) -> dict[str, float]:
    client, count = counted_client(cluster.kubeconfig)
    backend_class = MPIJobBackend if kind == "mpijob" else KubernetesBackend
    backend = backend_class(api_client=client, namespace=namespace)
    spec = MPIJobSpec.from_dict({
        "name": "bench", "image": "registry.example/airflow-mpi-train:0.1",
        "command": [sys.executable, "-c", PROGRAM], "workers": {"replicas": workers},
        "startup_timeout": 120, "timeout": 120,
    })  # fmt: skip
    identity = RunIdentity("bench", kind, uuid.uuid4().hex[:8])
    plan = backend.render_plan(spec, identity) if isinstance(backend, MPIJobBackend) else render_plan(spec, identity)
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


def pod_start_latency(cluster: Cluster, namespace: str, runs: int) -> float:
    """A bare pod (``true``): create -> the node agent reports it ran (scheduler + agent)."""
    api = cluster.api()
    times = []
    for i in range(runs):
        name = f"latency-{i}"
        container = {"name": "c", "image": "registry.example/x:1", "command": ["true"]}
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


def measure(quick: bool) -> dict[str, Any]:
    if not built(("etcd", "kubernetes", "mpi-operator")):
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
        namespace = "bench"
        cluster.create_namespace(namespace)
        results["pod_start_latency"] = pod_start_latency(cluster, namespace, 3 if quick else 7)
        for workers in (2,) if quick else (2, 8):
            for kind in ("pods", "mpijob"):
                results[f"{kind}_{workers}"] = one_job(cluster, namespace, kind, workers)
        cluster.delete_namespace(namespace)
    finally:
        cluster.stop()
        with contextlib.suppress(OSError):
            root.rmdir()  # only if empty
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(measure("--quick" in sys.argv), indent=2))
