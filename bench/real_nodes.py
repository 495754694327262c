"""Real Nodes (tests/cluster/nodes.py: a kubelet, containerd and runc each, CNI, kube-proxy,
CoreDNS) against the node agent they replace, and the training image they run: the image build
cold (from the cache's record) and warm, its size; the cluster up; a bare pod's create -> ran;
submit -> every rank started for the pods, MPIJob, Volcano and TrainJob backends (the median of
a few jobs each, taken in turn); the master's log through
the real apiserver's log proxy from a real kubelet, ours and KubernetesPodOperator's, against
reading the container's log file directly (the limit)."""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import real_cluster  # noqa: E402

from tests.cluster import image  # noqa: E402
from tests.cluster.cluster import Cluster, built  # noqa: E402
from tests.cluster.nodes import node_tools_built  # noqa: E402

# Master + workers at 1 core each on 3 Nodes of this machine's 2 cores: 4 workers at most.
WORKERS = (2, 4)
KINDS = (*real_cluster.BACKENDS, "trainjob")
IMAGE_PYTHON = "python"


def image_figures() -> dict[str, float]:
    t0 = time.monotonic()
    built_images = image.build_all(log=lambda _m: None)
    warm = time.monotonic() - t0
    train, base = built_images["train"], built_images["base"]
    return {
        "cold": train.seconds + base.seconds,
        "warm": warm,
        "size_mib": train.size_bytes / 2**20,
        "base_size_mib": base.size_bytes / 2**20,
    }


def read_log_file_directly(cluster: Cluster, namespace: str, lines: int) -> float:
    """Lines/s of parsing the container log file the kubelet and containerd wrote (CRI format),
    for a pod that printed ``lines`` lines: the most any reader through the apiserver could get."""
    assert cluster.real is not None
    api = cluster.api()
    program = f"import sys\nfor i in range({lines}): sys.stdout.write(f'line {{i:08d}}\\n')\n"
    container = {"name": "c", "image": image.TRAIN_IMAGE, "command": [IMAGE_PYTHON, "-c", program]}
    spec = {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [container]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "direct"}, "spec": spec}
    api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    path = f"/api/v1/namespaces/{namespace}/pods/direct"
    api.wait("direct", lambda: api.get(path)["status"].get("phase") == "Succeeded", 120, 0.1)
    logs = [p for n in cluster.real.nodes for p in (n.workdir / "pod-logs").glob(f"{namespace}_direct_*/c/*.log")]
    started = time.monotonic()
    count = 0
    with open(logs[0], encoding="utf-8") as handle:
        for record in handle:  # "<time> stdout F <line>"
            if record.split(" ", 3)[3]:
                count += 1
    elapsed = time.monotonic() - started
    api.delete(path)
    assert count == lines, (count, lines)
    return count / elapsed


def training_in_containers(cluster: Cluster, namespace: str, epochs: int) -> dict[str, float]:
    """The example's training (3 pods, 1 rank each) through the runner, then the same script
    under a bare ``mpiexec -np 3`` run in the same job's master container (``kubectl exec``),
    same hosts, ssh configuration, btl and env: rank 0's optimizer steps per second of each."""
    import threading

    import training
    from kubernetes import client
    from kubernetes.stream import stream
    from launch_overhead import _quietly

    from airflow_mpi.backends.kubernetes import KubernetesBackend
    from airflow_mpi.job.naming import RunIdentity
    from airflow_mpi.job.plan import render_plan
    from airflow_mpi.job.topology import render_mpi_hosts
    from airflow_mpi.runner.job import JobRunner
    from airflow_mpi.spec import MPIJobSpec
    from tests.cluster.conftest import api_client

    training.prepare_data()
    data = str(training.DATA)

    def plan_of(command: list[str], name: str) -> Any:
        spec = {"name": name, "image": image.TRAIN_IMAGE, "command": command, "workers": {"replicas": 2},
                "env": training.ENV, "mpi": {"btl": "tcp,self"}, "timeout": 900,
                "pod": {"volumes": [{"name": "data", "host_path": data, "mount_path": data}]}}  # fmt: skip
        return render_plan(MPIJobSpec.from_dict(spec), RunIdentity("bench", name, f"t-{time.time_ns()}"))

    def command() -> list[str]:
        checkpoints = f"{data}/checkpoints-{time.time_ns()}"
        script = "/app/train_digits.py"  # the image's copy
        return [IMAGE_PYTHON, script, "--data", data, "--epochs", str(epochs), "--checkpoints", checkpoints]

    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
    try:
        ours = JobRunner(backend, plan_of(command(), "train"), lambda _t: None).run().result
        held = plan_of(["sleep", "900"], "bare")
        runner = JobRunner(backend, held, lambda _t: None)
        thread = threading.Thread(target=lambda: _quietly(runner.run), daemon=True)  # ends when torn down
        thread.start()
        core = client.CoreV1Api(backend.api_client)
        api = cluster.api()
        master = f"/api/v1/namespaces/{namespace}/pods/{held.master.name}"

        def master_running() -> bool:
            return ((api.get_or_none(master) or {}).get("status") or {}).get("phase") == "Running"

        api.wait("the held master running", master_running, 180, 0.5)
        time.sleep(5)  # the job's own mpiexec has started its sleeping ranks
        topology = held.topology
        ranks_env = ('RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE '
                     'LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK exec "$@"')  # fmt: skip
        argv = [
            "mpiexec", "--allow-run-as-root", "--host", render_mpi_hosts(topology), "-np", str(topology.np),
            "--mca", "orte_keep_fqdn_hostnames", "1", "--mca", "plm_rsh_args", f"-F {held.paths.ssh_config}",
            "--mca", "btl", "tcp,self", *[a for k, v in training.ENV.items() for a in ("-x", f"{k}={v}")],
            "-x", f"MASTER_ADDR={topology.rank0_host}", "-x", "MASTER_PORT=29501",
            "bash", "-c", ranks_env, "rank", *command(),
        ]  # fmt: skip
        out = stream(core.connect_get_namespaced_pod_exec, held.master.name, namespace, command=argv,
                     stderr=True, stdout=True, stdin=False, tty=False, _request_timeout=900)  # fmt: skip
        found = [line for line in out.splitlines() if line.startswith(training.RESULT)]
        if not found:
            raise RuntimeError(f"bare mpiexec in the container reported nothing: {out[-2000:]}")
        bare = json.loads(found[-1][len(training.RESULT) :])
        runner.teardown()
        thread.join(60)
    finally:
        import shutil

        shutil.rmtree(training.DATA, ignore_errors=True)
    return {"operator_steps_per_s": ours["steps_per_second"], "bare_steps_per_s": bare["steps_per_second"]}


def store_import_seconds() -> float:
    """What importing the images into the Nodes' shared store took, cold (the cache's record)."""
    from tests.cluster.nodes import NODE_STORE_CACHE

    record = next(NODE_STORE_CACHE.glob("*/.complete"))
    return float(json.loads(record.read_text())["seconds"])


def measure(quick: bool) -> dict[str, Any]:
    if not (built(("etcd", "kubernetes", "mpi-operator", "volcano", "jobset", "trainer")) and node_tools_built()):
        raise RuntimeError("the Nodes are not built: run `make cluster-build`")
    results: dict[str, Any] = {"image": image_figures()}
    archives = list(image.cached_archives().values())
    root = Path("/var/tmp/airflow-mpi-bench")
    root.mkdir(parents=True, exist_ok=True)
    runs = 3 if quick else 7
    try:
        agent = Cluster(Path(tempfile.mkdtemp(prefix="agent-", dir=root)))
        try:
            agent.start()
            results["agent_up"] = agent.timings["cluster"]
            agent.create_namespace("bench")
            results["agent_pod_start"] = real_cluster.pod_start_latency(agent, "bench", runs)
        finally:
            agent.stop()
        cluster = Cluster(Path(tempfile.mkdtemp(prefix="nodes-", dir=root)), images=archives)
        try:
            cluster.start()
            results["nodes_up"] = cluster.timings["cluster"]
            results["store_import"] = store_import_seconds()
            cluster.controller("mpi-operator")
            cluster.controller("volcano")
            cluster.controller("trainer")
            namespace = "bench"
            cluster.create_namespace(namespace)
            results["nodes_pod_start"] = real_cluster.pod_start_latency(cluster, namespace, runs, image.BASE_IMAGE)
            for workers in WORKERS[:1] if quick else WORKERS:
                starts: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
                # In turn, so a slow moment of the machine hits every kind; 7 each, as a pod's
                # start alone varies by a second here (3 each gave medians that flipped run to run).
                for _ in range(1 if quick else 7):
                    for kind in KINDS:
                        starts[kind].append(
                            real_cluster.one_job(cluster, namespace, kind, workers, image.TRAIN_IMAGE, IMAGE_PYTHON)
                        )
                for kind, jobs in starts.items():
                    results[f"{kind}_{workers}"] = {
                        key: statistics.median(job[key] for job in jobs)
                        for key in ("ranks_started", "requests", "total")
                    }
            real_cluster.LOG_IMAGE[:] = [image.TRAIN_IMAGE, IMAGE_PYTHON]
            results["logs"] = real_cluster.kpo_comparison(cluster, namespace, quick)
            results["logs_direct"] = read_log_file_directly(cluster, namespace, 20_000 if quick else 100_000)
            results["training"] = training_in_containers(cluster, namespace, 10 if quick else 40)
            cluster.delete_namespace(namespace)
        finally:
            cluster.stop()
    finally:
        with contextlib.suppress(OSError):
            root.rmdir()
    return results


def measure_logs(quick: bool) -> dict[str, Any]:
    """The log figures alone (``--logs``): what profiling the log path needs, in about 3 minutes."""
    archives = list(image.cached_archives().values())
    root = Path("/var/tmp/airflow-mpi-bench")
    root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="nodes-", dir=root)), images=archives)
    try:
        cluster.start()
        cluster.create_namespace("bench")
        real_cluster.LOG_IMAGE[:] = [image.TRAIN_IMAGE, IMAGE_PYTHON]
        results = {
            "logs": real_cluster.kpo_comparison(cluster, "bench", quick),
            "logs_direct": read_log_file_directly(cluster, "bench", 20_000 if quick else 100_000),
        }
        cluster.delete_namespace("bench")
    finally:
        cluster.stop()
        with contextlib.suppress(OSError):
            root.rmdir()
    return results


if __name__ == "__main__":
    run = measure_logs if "--logs" in sys.argv else measure
    print(json.dumps(run("--quick" in sys.argv), indent=2))
