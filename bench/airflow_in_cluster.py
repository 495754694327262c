"""Airflow deployed inside the real cluster (tests/cluster/airflow.py, what `make airflow-up`
runs) against Airflow on this machine, both running the example DAG against the same cluster:
the deployment up cold (the images imported into the Nodes) and warm, its images' sizes, its
components' memory, and the example DAG's wall time (preprocess -> train on 3 ranks on 3 Nodes
-> evaluate) in the cluster (KubernetesExecutor: every task a pod) and by ``dag.test()`` on this
machine with the administrator's kubeconfig, the same image, claim and epochs.

    .venv/bin/python bench/airflow_in_cluster.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.airflow_rest import AirflowREST  # noqa: E402
from tests.cluster import airflow as deployment  # noqa: E402
from tests.cluster import image  # noqa: E402
from tests.cluster.cluster import Cluster, built  # noqa: E402
from tests.cluster.nodes import node_tools_built  # noqa: E402

EXAMPLE = "mpi_training_pipeline"

# dag.test() of the example on this machine, against the cluster: prints the run's state and
# its seconds from start to end (the same span as the deployed run's start_date -> end_date).
HOST_RUN = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(dag_folder=sys.argv[1]).get_dag(sys.argv[2])
run = dag.test(run_conf=json.loads(sys.argv[3]))
print("HOST_RUN " + json.dumps({"state": str(run.state), "seconds": (run.end_date - run.start_date).total_seconds()}))
"""


def seconds_between(start: str, end: str) -> float:
    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    return (parse(end) - parse(start)).total_seconds()


def in_cluster_run(rest: AirflowREST, epochs: int) -> dict[str, Any]:
    """The example through the deployment's REST API, waiting: the run's and each task's seconds."""
    deadline = time.monotonic() + 300
    while not rest.dag(EXAMPLE):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{EXAMPLE} not parsed in the deployment: {rest.import_errors()}")
        time.sleep(2)
    rest.unpause(EXAMPLE)
    run_id = rest.trigger(EXAMPLE, {"deferrable": False, "epochs": epochs})
    state = rest.wait_run(EXAMPLE, run_id, 1200)
    if state != "success":
        raise RuntimeError(f"the example in the cluster: {state}")
    run = rest.run(EXAMPLE, run_id)
    tasks = {task: rest.task_instance(EXAMPLE, run_id, task) for task in ("preprocess", "train", "evaluate")}
    durations = rest.xcom(EXAMPLE, run_id, "train").get("durations_s") or {}
    return {
        "seconds": seconds_between(run["start_date"], run["end_date"]),
        "tasks": {name: float(ti.get("duration") or 0.0) for name, ti in tasks.items()},
        "job": {name: float(value) for name, value in durations.items()},  # create, sshd_ready, mpiexec, total
    }


def host_run(cluster: Cluster, deployed: deployment.AirflowDeployment, epochs: int, home: Path) -> dict[str, Any]:
    """The example by ``dag.test()`` on this machine, against the same cluster: the administrator's
    kubeconfig, namespace ``training``, the deployment's claim (its hostPath directory is where
    this machine's preprocess writes the data the ranks then read through the claim)."""
    data = Path(deployed.values.data_root) / "training-data"
    kubeconfig = Path(cluster.kubeconfig).read_text()
    ours = ("AIRFLOW__", "AIRFLOW_CONN_", "MPI_DEMO_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(ours)}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        PYTHONPATH=str(REPO),
        AIRFLOW_CONN_KUBERNETES_HOST=json.dumps({"conn_type": "kubernetes", "extra": {"kube_config": kubeconfig}}),
        AIRFLOW_CONN_MPI_DEFAULT=json.dumps({"conn_type": "mpi", "extra": {
            "backend": "kubernetes", "kubernetes_conn_id": "kubernetes_host", "namespace": deployed.training}}),
        MPI_DEMO_IMAGE=image.TRAIN_IMAGE,
        MPI_DEMO_SCRIPT="/app/train_digits.py",
        MPI_DEMO_DATA=str(data),
        MPI_DEMO_PVC="training-data",
    )  # fmt: skip
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
    conf = json.dumps({"deferrable": False, "epochs": epochs})
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", HOST_RUN, str(REPO / "dags"), EXAMPLE, conf],
        env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    wall = time.monotonic() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("HOST_RUN ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"dag.test() of the example on this machine failed:\n{(done.stdout + done.stderr)[-4000:]}")
    result = json.loads(lines[-1].removeprefix("HOST_RUN "))
    if result["state"] not in ("success", "DagRunState.SUCCESS"):
        raise RuntimeError(f"dag.test() of the example on this machine: {result['state']}\n{done.stdout[-3000:]}")
    return {"seconds": float(result["seconds"]), "process": wall}


def measure(quick: bool) -> dict[str, Any]:
    if not (built() and node_tools_built() and image.cached_archives() and image.airflow_archives()):
        raise RuntimeError("needs the cluster, the Nodes and the images: `make cluster-build image airflow-image`")
    epochs = 12 if quick else 30
    results: dict[str, Any] = {"epochs": epochs}
    archives = image.airflow_archives()
    results["image_mib"] = {name: path.stat().st_size / 2**20 for name, path in archives.items()}
    root = Path("/var/tmp/airflow-mpi-bench")
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="airflow-", dir=root))
    dags = work / "dags"
    shutil.copytree(REPO / "dags", dags, ignore=shutil.ignore_patterns("__pycache__"))
    dags.chmod(0o755)
    (work / "cluster").mkdir()
    cluster = Cluster(work / "cluster", images=list(image.cached_archives().values()))
    try:
        cluster.start()
        quiet = lambda _message: None  # noqa: E731
        cold = deployment.deploy(cluster, dags, log=quiet)
        results["up_cold"], results["image_import"] = cold.timings["up"], cold.timings["image import"]
        if not quick:  # again, the images in the Nodes' stores already
            started = time.monotonic()
            deployment.undeploy(cold)
            results["down"] = time.monotonic() - started
            cold = deployment.deploy(cluster, dags, log=quiet)
            results["up_warm"] = cold.timings["up"]
        deployed = cold
        try:
            time.sleep(0 if quick else 30)  # settled: the idle working sets
            memory = deployment.memory_by_pod(deployed.api(), deployed.namespace)
            results["memory_mib"] = sum(memory.values()) / 2**20
            rest = AirflowREST(deployed.url, deployed.user, deployed.password)
            # Twice: the first run on fresh Nodes also unpacks the training image into each
            # Node's containerd (5.5 GiB); the host's run comes after, on Nodes that have it.
            results["in_cluster_first"] = in_cluster_run(rest, epochs)
            results["in_cluster"] = in_cluster_run(rest, epochs)
            print(f"so far: {json.dumps(results)}", file=sys.stderr, flush=True)
            results["host"] = host_run(cluster, deployed, epochs, work / "host-home")
        finally:
            deployment.undeploy(deployed)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            root.rmdir()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(measure(parser.parse_args().quick), indent=1))
