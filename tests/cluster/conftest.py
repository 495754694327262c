"""The real-cluster tier: the real kube-apiserver, kube-controller-manager, kube-scheduler and
etcd, built from upstream source (tests/cluster/build.py), with the node agent running the pods
for real. One cluster for the tests of this directory (package scope: its network bridge must not
outlive them, the other tiers' leak checks would see it).

Without the binaries the tier is skipped with one line saying how to build them; under CI (or
AIRFLOW_MPI_REQUIRE_CLUSTER=1) it is required and fails instead.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster import Cluster, built
from tests.cluster.kubeapi import KubeApi

JOB_KINDS = ("pods", "services", "secrets", "configmaps")
HOW_TO_BUILD = (
    "the real-cluster tier needs kube-apiserver, kube-controller-manager, kube-scheduler and etcd built "
    "from source: run `make cluster-build` (Go and the Go module proxy; ~30 min once, cached in "
    "~/.cache/airflow-mpi/k8s)"
)


# The modules that start mpi-operator: one cluster on this host may run it at a time (its health
# port is fixed: controlplane.host_lock), and the real-Node tier, beside this session under `make
# test`, holds it until it ends. They run last, so this session does the rest meanwhile.
MPI_OPERATOR_MODULES = ("test_deferred_kinds_real.py", "test_kueue_real.py", "test_mpijob_real.py",
                        "test_retries_real.py")  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This directory's tests in their order, those of ``MPI_OPERATOR_MODULES`` last."""
    here = Path(__file__).parent
    slots = [at for at, item in enumerate(items) if Path(str(item.fspath)).parent == here]
    ours = [items[at] for at in slots]
    late = [item for item in ours if Path(str(item.fspath)).name in MPI_OPERATOR_MODULES]
    for at, item in zip(slots, [item for item in ours if item not in late] + late, strict=True):
        items[at] = item


def _required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("AIRFLOW_MPI_REQUIRE_CLUSTER") == "1"


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    from airflow_mpi.backends.local import check_prerequisites
    from tests.leaks import ours

    missing = check_prerequisites()
    if not built() or missing:
        reason = HOW_TO_BUILD if not built() else "needs " + "; ".join(missing)
        if _required():
            pytest.fail(reason)
        pytest.skip(reason)
    root = Path("/var/tmp/airflow-mpi-tests")
    root.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="cluster-", dir=root)))
    cluster.start()
    try:
        yield cluster
        assert cluster.running_pods() == [], "pods still running on the node agent"
    finally:
        cluster.stop()
    assert not ours(), f"leaked: {ours()}"


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the test's own; after the test nothing of any job may be left in it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    yield name
    left = job_objects(cluster.api(), name)
    cluster.delete_namespace(name, wait=0)  # the namespace controller finishes it in the background
    assert left == [], f"left in {name}: {left}"


def job_objects(api: KubeApi, namespace: str) -> list[str]:
    found = []
    for plural in JOB_KINDS:
        for obj in api.get(f"/api/v1/namespaces/{namespace}/{plural}")["items"]:
            if "airflow-mpi.io/job" in (obj["metadata"].get("labels") or {}):
                found.append(f"{plural}/{obj['metadata']['name']}")
    return found


CORE_LEFT = (
    *(f"/api/v1/namespaces/{{ns}}/{plural}" for plural in JOB_KINDS),
    "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",  # the deferred log's mark
)
# A rank that trains until it is stopped, saying so first (when to evict or time out).
TRAINS_FOREVER = "import time\nprint('training', flush=True)\ntime.sleep(600)\n"


def objects_left(api: KubeApi, namespace: str, paths: tuple[str, ...]) -> list[str]:
    """Whatever is still in ``namespace`` under each ``paths`` (``{ns}`` filled in), but the
    root CA ConfigMap every namespace gets."""
    return [
        f"{path.rsplit('/', 1)[-1]}/{obj['metadata']['name']}"
        for path in paths
        for obj in api.get(path.format(ns=namespace))["items"]
        if obj["metadata"]["name"] != "kube-root-ca.crt"
    ]


def run_evicting_a_worker(cluster: Any, namespace: str, backend: Any, plan: Any) -> tuple[Any, str]:
    """Run the job (its command: ``TRAINS_FOREVER``) and have the node evict worker 1 once it
    trains; the job's failure and the evicted pod's name."""
    from airflow_mpi.exceptions import JobFailed
    from airflow_mpi.runner.job import JobRunner

    log = Log()
    victim = f"{plan.job_name}-worker-1"
    thread = when_logged(log, "training", lambda: cluster.evict(namespace, victim))
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    thread.join()
    return caught.value, victim


def api_client(kubeconfig: Path) -> Any:
    """A kubernetes client configured as the backend configures its own."""
    from kubernetes import client, config

    from airflow_mpi.backends.kube_connection import configure_client

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configure_client(configuration, 28))


def install_connections(monkeypatch: pytest.MonkeyPatch, kubeconfig: Path, namespace: str,
                        mpi_conn_id: str = "mpi_k8s", **extra: Any) -> None:  # fmt: skip
    """Airflow connections to the cluster: ``mpi_conn_id`` (mpi, kubernetes backend) ->
    ``kube_real`` (the cncf provider's kubernetes connection with the kubeconfig)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBE_REAL",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig), "namespace": namespace}}),
    )
    extra = {"backend": "kubernetes", "kubernetes_conn_id": "kube_real", "namespace": namespace, **extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{mpi_conn_id.upper()}", json.dumps({"conn_type": "mpi", "extra": extra}))


class Log(list[str]):
    """A job's log records, line by line (what ``JobRunner`` emits)."""

    def __call__(self, text: str) -> None:
        self.extend(text.splitlines())


def when_logged(log: list[str], text: str, action: Callable[[], object], timeout: float = 90) -> threading.Thread:
    """Run ``action`` in a thread once a line of ``log`` contains ``text`` (or after ``timeout``)."""

    def wait_then_act() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(text in line for line in log):
            time.sleep(0.05)
        action()

    thread = threading.Thread(target=wait_then_act)
    thread.start()
    return thread


# Every rank's host name to rank 0, which prints them with an allreduce's sum.
HOSTS_PROGRAM = (
    "from mpi4py import MPI; import json, socket; c = MPI.COMM_WORLD; s = c.allreduce(c.rank + 1)\n"
    "hosts = c.gather(socket.gethostname())\n"
    "if c.rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'sum': s, 'size': c.size, 'hosts': sorted(hosts)}))"
)


def real_job(cluster: Any, namespace: str, kind: str, **fields: Any) -> tuple[Any, Any]:
    """A backend of ``kind`` on ``cluster`` and the plan of a job of this run (``fields`` override
    the spec, ``name`` among them): master and 2 workers running ``HOSTS_PROGRAM`` with this
    machine's Python."""
    import sys

    from airflow_mpi.backends.kubernetes import KubernetesBackend
    from airflow_mpi.job.naming import RunIdentity
    from airflow_mpi.runner.retries import plan_for
    from airflow_mpi.spec import MPIJobSpec

    backend = KubernetesBackend(kind=kind, api_client=api_client(cluster.kubeconfig), namespace=namespace)
    data: dict[str, Any] = {
        "name": f"{kind[:3]}real",
        "image": "registry.example/airflow-mpi-train:0.1",
        "command": [sys.executable, "-c", HOSTS_PROGRAM],
        "workers": {"replicas": 2},
        "startup_timeout": 90,
        "timeout": 120,
        **fields,
    }
    identity = RunIdentity(f"{data['name']}-dag", "train", f"r-{time.monotonic_ns()}")
    return backend, plan_for(backend, MPIJobSpec.from_dict(data), identity)


# The Airflow task process as the Task SDK's task runner runs it: SIGTERM (what the supervisor sends
# when the task is killed, marked failed or timed out) calls the operator's on_kill. argv: the job,
# the run id, the ``mpi`` connection.
KILLED_TASK = """
import json, signal, sys
from types import SimpleNamespace
from airflow_mpi.operators.mpi import MPIJobOperator
operator = MPIJobOperator(task_id="train", job=json.loads(sys.argv[1]), mpi_conn_id=sys.argv[3])
def on_term(signum, frame):
    operator.on_kill()
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
ti = SimpleNamespace(dag_id="killdag", task_id="train", run_id=sys.argv[2], map_index=-1, try_number=1)
operator.execute({"ti": ti})
"""


def kill_task_once(job: dict[str, Any], conn_id: str, started: Callable[[], bool]) -> tuple[int, str]:
    """Run ``job`` as an Airflow task process through ``conn_id`` until ``started()``, then kill
    the task (SIGTERM); its exit code and output."""
    import os
    import subprocess
    import sys

    from tests.cluster.controlplane import wait_for

    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_TASK, json.dumps(job), f"run-{time.monotonic_ns()}", conn_id],
        env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for("the job started", started, 120)
        time.sleep(2)
        child.send_signal(15)
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    return child.returncode, child.stdout.read() if child.stdout else ""
