"""The hang watchdog on real Nodes: the stacks come through the real exec API (apiserver ->
kubelet -> containerd -> runc) from every pod; a stopped rank is named, the others' stacks are in
the log; a skipped collective shows where each rank waits; heartbeats that the pattern does not
match are no progress; ``airflow-mpi stacks`` asks a healthy MPIJob's pods (its launch script
elsewhere) and the watchdog leaves the job alone; nothing is left."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_mpi.backends import KUBERNETES_KINDS
from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobHung
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.observe.output import build_rank_pods
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import Log, api_client, job_objects
from tests.cluster.image import TRAIN_IMAGE
from tests.integration.test_hangs_local import stacks_while_it_trains, training
from tests.nodes.test_real_nodes import backend_for, make_plan

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


@pytest.mark.parametrize("kind", ["pods", "volcano"])
def test_a_stopped_rank_is_named_and_every_other_ranks_stack_logged(
    cluster: Cluster, namespace: str, kind: str
) -> None:
    backend = backend_for(cluster, namespace)
    if kind != "pods":
        cluster.controller(kind)
        backend = KubernetesBackend(api_client=api_client(cluster.kubeconfig), namespace=namespace, kind=kind)
    spec = make_plan(workers=2, command=["python", "-c", training(stop_rank=1)], progress_timeout=15, timeout=300).spec
    plan = backend.render_plan(spec, RunIdentity("nodesdag", "hang", f"run-{time.monotonic_ns()}"))
    pods = build_rank_pods(plan.spec, plan.topology)
    log = Log()
    started = time.monotonic()
    with pytest.raises(JobHung) as caught:
        JobRunner(backend, plan, log).run()
    seconds, message = time.monotonic() - started, str(caught.value)
    assert seconds < 15 + 15 + 60, (seconds, message)  # the pods' start, ~1 s of steps, then the bound
    assert f"rank 1 on pod {pods[1]} did not answer: the process is stopped" in message, message
    text = "\n".join(log)
    for rank in (0, 2):
        block = text.split(f"--- rank {rank} on pod {pods[rank]}, pid ", 1)[-1].split("--- rank", 1)[0]
        assert "most recent call first" in block and "in allreduce_step" in block, text[-4000:]
    assert job_objects(cluster.api(), namespace) == []


def test_airflow_mpi_stacks_asks_an_mpijobs_pods_and_the_job_goes_on(
    cluster: Cluster, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.controller("mpi-operator")
    backend = KubernetesBackend(
        api_client=api_client(cluster.kubeconfig), namespace=namespace, kind=KUBERNETES_KINDS["mpijob"]
    )
    # A healthy job, a line every 2 s, under a watchdog of 6 s: asked for its stacks, never touched.
    spec = MPIJobSpec.from_dict({
        "name": "nstacks", "image": TRAIN_IMAGE, "command": ["python", "-c", training(steps=10, pause=2.0)],
        "workers": {"replicas": 2}, "startup_timeout": 90, "timeout": 300, "progress_timeout": 6,
    })  # fmt: skip
    plan = backend.render_plan(spec, RunIdentity("nodesdag", "stacks", f"run-{time.monotonic_ns()}"))
    log = Log()
    cli = ["stacks", plan.job_name, "--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace]
    code, results = stacks_while_it_trains(JobRunner(backend, plan, log), lambda: log, cli, 120)
    out = capsys.readouterr().out
    assert code == 0, out
    # A healthy job's ranks are caught wherever they are (a step's sleep, or its allreduce).
    assert out.count("most recent call first") >= 3 and "did not answer" not in out, out
    for rank in range(3):
        assert f"--- rank {rank} on {plan.job_name}-" in out, out
    assert results and results[0].exit_code == 0, log[-30:]
    assert not any("looks hung" in line for line in log), log[-30:]
    assert job_objects(cluster.api(), namespace) == []


def test_a_skipped_collective_and_heartbeats_without_progress_are_hangs_too(cluster: Cluster, namespace: str) -> None:
    # Two jobs side by side (2 pods each: the 3 Nodes have room for both): rank 1 of one skips an
    # allreduce and waits for a message; the other prints only heartbeats its pattern does not match.
    heartbeats = "import time\nwhile True:\n    print('heartbeat', flush=True)\n    time.sleep(0.5)\n"
    jobs = {
        "skip": make_plan(workers=1, command=["python", "-c", training(skip_rank=1)], progress_timeout=10),
        "beat": make_plan(workers=1, command=["python", "-c", heartbeats], progress_timeout=10,
                          progress_pattern=r"^step \d+"),
    }  # fmt: skip
    logs = {name: Log() for name in jobs}
    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        try:
            JobRunner(backend_for(cluster, namespace), jobs[name], logs[name]).run()
        except BaseException as error:  # the test reads it below
            errors[name] = error

    threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert all(isinstance(errors.get(name), JobHung) for name in jobs), errors
    skipped = "\n".join(logs["skip"])
    assert "in allreduce_step" in skipped.split("--- rank 1 ", 1)[0], skipped[-3000:]  # rank 0 waits in it
    assert "in wait_for_batch" in skipped.split("--- rank 1 ", 1)[1], skipped[-3000:]
    message = str(errors["beat"])
    assert "no rank printed a line matching progress_pattern for 10s" in message and "last line: heartbeat" in message
    assert job_objects(cluster.api(), namespace) == []
