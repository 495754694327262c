"""Faults only the real system produces: the apiserver restarting mid-job (the watch and the log
follow resume, every line exactly once), etcd compacted under a watch (410 Gone, relist), the
controller-manager (garbage collector) down during teardown, the scheduler down at start."""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
import urllib.request
from typing import Any

import pytest

from airflow_mpi.backends import removal
from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import SshdNotReady
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import Log, api_client, job_objects

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

LINES = 150
PROGRAM = (
    "import os, sys, time, json\n"
    "rank = int(os.environ['OMPI_COMM_WORLD_RANK'])\n"
    f"for i in range({LINES}):\n"
    "    print(f'rank {rank} line {i:04d}', flush=True); time.sleep(0.1)\n"
    "if rank == 0: print('AIRFLOW_MPI_RESULT ' + json.dumps({'done': True}))\n"
)


def make_plan(**fields: Any) -> JobPlan:
    data: dict[str, Any] = {
        "name": "fault",
        "image": "registry.example/airflow-mpi-train:0.1",
        "command": [sys.executable, "-c", PROGRAM],
        "workers": {"replicas": 1},
        "startup_timeout": 60,
        "timeout": 180,
    }
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), RunIdentity("faultdag", "train", f"r-{time.monotonic_ns()}"))


def rank_lines(log: list[str], rank: int) -> list[str]:
    return [line[line.index("rank ") :] for line in log if f"rank {rank} line " in line]


def when_lines(log: list[str], count: int, action: Any) -> threading.Thread:
    def wait_then_act() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(rank_lines(log, 0)) < count:
            time.sleep(0.05)
        action()

    thread = threading.Thread(target=wait_then_act)
    thread.start()
    return thread


def assert_every_line_once(log: list[str]) -> None:
    for rank in (0, 1):
        assert rank_lines(log, rank) == [f"rank {rank} line {i:04d}" for i in range(LINES)], rank


def compact_etcd(cluster: Cluster) -> int:
    """Compact etcd at its current revision (through its HTTP gateway): older revisions are gone."""
    base = f"http://127.0.0.1:{cluster.plane.etcd_port}/v3/kv"

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"{base}/{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return dict(json.loads(response.read()))

    revision = int(post("range", {"key": base64.b64encode(b"/registry").decode()})["header"]["revision"])
    post("compaction", {"revision": revision, "physical": True})
    return revision


def test_an_apiserver_restart_mid_job_loses_and_repeats_no_line(cluster: Cluster, namespace: str) -> None:
    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
    log = Log()
    restart = when_lines(log, 30, cluster.plane.restart_apiserver)
    result = JobRunner(backend, make_plan(), log).run()
    restart.join()
    assert result.result == {"done": True}
    assert_every_line_once(log)
    assert job_objects(cluster.api(), namespace) == []


def test_etcd_compacted_under_the_watch_is_relisted(cluster: Cluster, namespace: str) -> None:
    """A compaction, then an apiserver restart: its watch cache starts again at the compacted
    revision, so resuming the pod watch from the old resourceVersion answers 410 Gone."""
    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
    log = Log()

    def compact_and_restart() -> None:
        compact_etcd(cluster)
        cluster.plane.restart_apiserver()

    fault = when_lines(log, 30, compact_and_restart)
    result = JobRunner(backend, make_plan(), log).run()
    fault.join()
    assert result.result == {"done": True}
    assert_every_line_once(log)
    assert job_objects(cluster.api(), namespace) == []


def test_teardown_with_the_garbage_collector_down_is_bounded_and_complete(
    cluster: Cluster, namespace: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Teardown deletes the Service and leaves the rest to the garbage collector: with the
    collector down, the backend deletes the pods, and the Secret with the job's private key, itself
    once TEARDOWN_WAIT has passed, and says why (the wait is 15 s here, 60 s in the product: what
    is tested is what happens when it passes)."""
    monkeypatch.setattr(removal, "TEARDOWN_WAIT", 15.0)
    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
    program = (
        "import json, os\nif os.environ['OMPI_COMM_WORLD_RANK'] == '0': print('AIRFLOW_MPI_RESULT ' + json.dumps(1))\n"
    )
    plan = make_plan(command=[sys.executable, "-c", program])
    cluster.plane.stop_component("kube-controller-manager")
    try:
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="airflow_mpi.backends.kubernetes"):
            result = JobRunner(backend, plan, Log()).run()
        assert result.result == 1
        assert time.monotonic() - started < removal.TEARDOWN_WAIT + 45
        assert f"the garbage collector did not delete the pods of job {plan.job_name}" in caplog.text
        assert "is kube-controller-manager running?" in caplog.text
        assert job_objects(cluster.api(), namespace) == []
    finally:
        cluster.plane.start_component("kube-controller-manager")


def test_the_scheduler_down_is_named_at_startup_timeout(cluster: Cluster, namespace: str) -> None:
    backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace)
    plan = make_plan(startup_timeout=6)
    cluster.plane.stop_component("kube-scheduler")
    try:
        started = time.monotonic()
        with pytest.raises(SshdNotReady) as caught:
            JobRunner(backend, plan, Log()).run()
        assert 6 <= time.monotonic() - started < 6 + 20
        message = str(caught.value)
        assert "NotScheduled: no scheduler has looked at the pod" in message, message
    finally:
        cluster.plane.start_component("kube-scheduler")
    assert job_objects(cluster.api(), namespace) == []
