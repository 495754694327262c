"""Volcano for real: its webhook manager, controller manager and scheduler built from its module
and installed as its chart installs them (tests/cluster/volcano.py). The Volcano Job backend
(Volcano makes the pods from our task templates, its svc plugin their hosts, its policies end the
job) and ``gang: volcano`` on plain pods (our PodGroup, Volcano's scheduler) run real ranks on the
node agent; a queue too small for the job holds it, and raising the queue's capability admits it."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed, JobTimeout
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.runner.job import JobRunner
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import TRAINS_FOREVER, Log, objects_left, real_job, run_evicting_a_worker, when_logged
from tests.cluster.volcano import create_queue

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

VOLCANO_PLURALS = ("/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs",
                   "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups")  # fmt: skip
QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"
BACKENDS = [pytest.param("volcano", id="volcano-job"), pytest.param("pods", id="gang-volcano")]


@pytest.fixture
def volcano(cluster: Cluster) -> Cluster:
    cluster.controller("volcano")
    return cluster


@pytest.fixture
def queue(volcano: Cluster) -> Any:
    """A Volcano queue of the test's own, deleted afterwards; ``queue(capability)`` makes it."""
    api = volcano.api()
    made: list[str] = []

    def make(capability: dict[str, str] | None = None) -> str:
        name = f"q-{time.monotonic_ns() % 10**9}"
        create_queue(api, name, capability)
        api.wait(f"queue {name} open", lambda: api.get(f"{QUEUES}/{name}").get("status", {}).get("state") == "Open", 30)
        made.append(name)
        return name

    yield make
    for name in made:
        api.delete(f"{QUEUES}/{name}")


def volcano_left(cluster: Cluster, namespace: str) -> list[str]:
    return objects_left(cluster.api(), namespace, VOLCANO_PLURALS)


def make(cluster: Cluster, namespace: str, kind: str, scheduling: dict[str, Any] | None = None,
         **fields: Any) -> tuple[KubernetesBackend, JobPlan]:  # fmt: skip
    """The Volcano Job backend (``kind="volcano"``) or plain pods with ``gang: volcano``."""
    gang = {} if kind == "volcano" else {"gang": "volcano"}
    return real_job(
        cluster, namespace, kind, **{"name": "vcreal", "scheduling": {**gang, **(scheduling or {})}, **fields}
    )


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_real_job_runs_under_volcano(volcano: Cluster, namespace: str, kind: str) -> None:
    backend, plan = make(volcano, namespace, kind)
    log = Log()
    result = JobRunner(backend, plan, log).run()
    job = plan.job_name
    assert result.exit_code == 0, log
    assert result.result == {
        "sum": 6,
        "size": 3,
        "hosts": sorted([f"{job}-master-0", f"{job}-worker-0", f"{job}-worker-1"]),
    }, log
    api = volcano.api()
    if kind == "volcano":
        assert any("(started with them)" in line for line in log), log  # no master made after the workers
        # Volcano made the pods (owned by its Job), not us; its scheduler bound them.
        events = api.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        scheduled = {e["involvedObject"]["name"] for e in events if e["reason"] == "Scheduled"}
        assert {f"{job}-master-0", f"{job}-worker-0", f"{job}-worker-1"} <= scheduled, scheduled
        assert any(e["source"].get("component") == "volcano" for e in events if e["reason"] == "Scheduled")
    assert volcano_left(volcano, namespace) == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_failing_rank_is_named(volcano: Cluster, namespace: str, kind: str) -> None:
    program = "from mpi4py import MPI; import sys\nif MPI.COMM_WORLD.rank == 2: sys.exit(3)\nMPI.COMM_WORLD.Barrier()\n"
    backend, plan = make(volcano, namespace, kind, command=[sys.executable, "-m", "mpi4py", "-c", program])
    log = Log()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    assert (caught.value.rank, caught.value.exit_code) == (2, 3), log
    assert volcano_left(volcano, namespace) == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_an_evicted_worker_ends_the_job(volcano: Cluster, namespace: str, kind: str) -> None:
    backend, plan = make(volcano, namespace, kind, command=[sys.executable, "-c", TRAINS_FOREVER])
    failure, victim = run_evicting_a_worker(volcano, namespace, backend, plan)
    assert failure.pod == victim and "Evicted" in str(failure), failure
    assert volcano_left(volcano, namespace) == []


def test_the_timeout_ends_a_volcano_job(volcano: Cluster, namespace: str) -> None:
    program = "import time\nprint('forever', flush=True)\ntime.sleep(600)\n"
    backend, plan = make(volcano, namespace, "volcano", command=[sys.executable, "-c", program], timeout=5)
    started = time.monotonic()
    with pytest.raises(JobTimeout):
        JobRunner(backend, plan, Log()).run()
    assert time.monotonic() - started < 5 + 40
    assert volcano_left(volcano, namespace) == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_queue_too_small_holds_the_job_until_its_capability_grows(
    volcano: Cluster, namespace: str, queue: Any, kind: str
) -> None:
    """Three pods of 1 CPU each wait in a queue capped at 2 CPUs (longer than startup_timeout,
    which does not run while queued); raised to 8 CPUs, the queue admits them."""
    name = queue({"cpu": "2"})
    backend, plan = make(volcano, namespace, kind, {"queue": name, "queue_timeout": 120}, startup_timeout=5)
    log = Log()
    api = volcano.api()
    raised: list[float] = []

    def raise_capability() -> None:
        time.sleep(8)  # held past the startup timeout
        api.patch(f"{QUEUES}/{name}", {"spec": {"capability": {"cpu": "8"}}}, kind="merge-patch")
        raised.append(time.monotonic())

    thread = when_logged(log, "waits for admission", raise_capability)
    result = JobRunner(backend, plan, log).run()
    thread.join()
    assert result.exit_code == 0 and result.result["size"] == 3, log
    assert raised, "the job ran before the queue was raised"
    # The wait names the queue (the scheduler's own verdict does not).
    assert any(f"queue {name!r}" in line for line in log if "waits for admission" in line), log
    assert volcano_left(volcano, namespace) == []


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_job_queued_past_queue_timeout_fails_naming_it(
    volcano: Cluster, namespace: str, queue: Any, kind: str
) -> None:
    name = queue({"cpu": "2"})
    backend, plan = make(volcano, namespace, kind, {"queue": name, "queue_timeout": 6}, startup_timeout=2)
    started = time.monotonic()
    with pytest.raises(JobTimeout, match="queue_timeout") as caught:
        JobRunner(backend, plan, Log()).run()
    assert 6 <= time.monotonic() - started < 6 + 40
    assert f"queue {name!r}" in str(caught.value), caught.value
    assert volcano_left(volcano, namespace) == []


def test_two_gangs_that_cannot_both_fit_run_one_after_the_other(volcano: Cluster, namespace: str, queue: Any) -> None:
    """A queue of 4 CPUs and two jobs of 3: Volcano admits one gang, the other waits whole
    (no partial start, no deadlock), then runs."""
    name = queue({"cpu": "4"})
    program = "import time\nprint('trained', flush=True)\ntime.sleep(4)\n"
    made = [make(volcano, namespace, "volcano", {"queue": name, "queue_timeout": 180},
                 command=[sys.executable, "-c", program]) for _ in range(2)]  # fmt: skip
    logs = [Log(), Log()]
    outcomes: list[Any] = [None, None]

    def run(index: int) -> None:
        backend, plan = made[index]
        try:
            outcomes[index] = JobRunner(backend, plan, logs[index]).run()
        except Exception as error:  # reported below
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert [getattr(o, "exit_code", o) for o in outcomes] == [0, 0], outcomes
    assert sum(any("waits for admission" in line for line in log) for log in logs) >= 1, logs
    assert volcano_left(volcano, namespace) == []
