"""The Kubernetes backend against the API double (prints figures; not a timed test).

The double runs in its own process (real HTTP on 127.0.0.1, pods made Ready at once by its
scripted kubelet); this process runs only what the operator runs. For N = 1, 10, 100, 1000
workers: API requests per job, submit -> all workers Ready, last Ready -> master created, peak
RSS. Then log streaming into a task-style logger: throughput under a flood, delay at a low rate,
and duplicates/losses over 20 dropped streams with the node clock 0, +2.5 s and -2.5 s off.

    .venv/bin/python bench/k8s_double.py [--sizes 1 10 100 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.job.naming import LABEL_ROLE, RunIdentity, job_selector
from airflow_mpi.job.plan import render_plan
from airflow_mpi.job.ssh import KeyPair, SshMaterial
from airflow_mpi.job.topology import build_topology
from airflow_mpi.observe.status import PodTable
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec

REPO = Path(__file__).resolve().parents[1]  # tests.doubles is imported from the checkout


class Double:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.doubles.kube_double"], stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method="POST" if data is not None else "GET")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read() or b"{}")

    def kube_connection(self) -> str:
        """An Airflow ``kubernetes`` connection (``AIRFLOW_CONN_...`` JSON) to this double."""
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "bench", "user": {"token": "double-token"}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "bench", "namespace": "default"}}],
            "current-context": "double",
        }
        return json.dumps({"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kubeconfig)}})

    def requests(self) -> list[list[str]]:
        return list(self.call("/_double/requests")["requests"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def backend_for(double: Double) -> KubernetesBackend:
    configuration = client.Configuration()
    configuration.host = double.url
    configuration.connection_pool_maxsize = 32
    return KubernetesBackend(api_client=client.ApiClient(configuration), namespace="default")


def plan_for(workers: int, name: str = "bench") -> Any:
    spec = MPIJobSpec.from_dict(
        {
            "name": name,
            "image": "registry.example/train:1",
            "command": ["python", "t.py"],
            "workers": {"replicas": workers},
        }
    )
    identity = RunIdentity("bench", "train", f"r-{time.time_ns()}")
    # Fixed keys: generating 1000 host keys is not what is measured here.
    from airflow_mpi.job.naming import build_job_name

    pods = build_topology(spec, build_job_name(spec.name, identity)).pods
    key = KeyPair("-----BEGIN OPENSSH PRIVATE KEY-----\nbench\n", "ssh-ed25519 AAAAbench bench")
    return render_plan(spec, identity, ssh=SshMaterial(client=key, host_keys=dict.fromkeys(pods, key)))


def scale(double: Double, workers: int) -> dict[str, float]:
    double.call("/_double/reset", {})
    double.call("/_double/knobs", {"master_lines": 10, "master_rate": 0, "master_exit": 0})
    backend = backend_for(double)
    plan = plan_for(workers)
    last_ready = [0.0]
    worker_pods = {worker.name for worker in plan.workers}
    ready_pods: set[str] = set()
    original = PodTable.apply

    def apply(table: PodTable, event: dict[str, Any]) -> bool:
        result = original(table, event)
        obj = event.get("object") or {}
        conditions = obj.get("status", {}).get("conditions") or []
        name = obj.get("metadata", {}).get("name", "")
        if (
            name in worker_pods
            and name not in ready_pods
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        ):
            ready_pods.add(name)
            if len(ready_pods) == workers:  # the last worker became Ready: the watch saw it now
                last_ready[0] = time.perf_counter()
        return result

    PodTable.apply = apply  # type: ignore[method-assign]
    runner = JobRunner(backend, plan, lambda _text: None)
    try:
        started = time.perf_counter()
        runner.create()
        runner.wait_ready()
        ready = time.perf_counter()
        runner.start_master()
        master_created = time.perf_counter()
        runner.finish()
    finally:
        teardown_started = time.perf_counter()
        runner.teardown()
        teardown = time.perf_counter() - teardown_started
        PodTable.apply = original  # type: ignore[method-assign]
    requests = double.requests()
    return {
        "requests": len(requests),
        "budget": workers + 10,
        "watches": sum(1 for _, path in requests if "watch=" in path),
        "submit_to_ready": ready - started,
        "ready_to_master": master_created - last_ready[0],
        "teardown": teardown,
    }


def bare_api(double: Double, workers: int) -> dict[str, float]:
    """What a hand-written client would do instead: POST the job's very manifests (16 at a time, as
    the backend does), poll the pod list until every worker is Ready, then DELETE each object."""
    from concurrent.futures import ThreadPoolExecutor

    from airflow_mpi.kinds.manifests import render_manifests

    double.call("/_double/reset", {})
    plan = plan_for(workers, "bare")
    manifests = render_manifests(plan, "default")
    for manifest in manifests:
        manifest["metadata"].pop("ownerReferences", None)  # no owner: nothing collects them early
    core = client.CoreV1Api(backend_for(double).api_client)
    create = {"Service": core.create_namespaced_service, "Secret": core.create_namespaced_secret}
    create["ConfigMap"], create["Pod"] = core.create_namespaced_config_map, core.create_namespaced_pod
    delete = {"Service": core.delete_namespaced_service, "Secret": core.delete_namespaced_secret}
    delete["ConfigMap"], delete["Pod"] = core.delete_namespaced_config_map, core.delete_namespaced_pod
    *objects, master = manifests

    def send(call: Any, *args: Any) -> None:
        """One request, retried as any client would when a pooled connection was closed under it
        (a 409 or 404 on a retry: the first attempt went through)."""
        for attempt in range(3):
            try:
                response = call(*args, _preload_content=False)
            except ApiException as error:
                if attempt and error.status in (404, 409):
                    return
                raise
            except urllib3.exceptions.ProtocolError:
                if attempt == 2:
                    raise
                continue
            response.read()  # read, so that the connection goes back to the pool
            response.release_conn()
            return

    selector = f"{job_selector(plan.job_name)},{LABEL_ROLE}=worker"
    with ThreadPoolExecutor(16) as pool:
        started = time.perf_counter()
        for manifest in objects[:3]:
            send(create[manifest["kind"]], "default", manifest)
        list(pool.map(lambda m: send(create["Pod"], "default", m), objects[3:]))
        while True:
            listed = core.list_namespaced_pod("default", label_selector=selector).items
            if len(listed) == workers and all(
                any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) for p in listed
            ):
                break
            time.sleep(0.01)
        ready = time.perf_counter()
        send(create["Pod"], "default", master)
        teardown_started = time.perf_counter()
        list(
            pool.map(
                lambda m: send(delete[m["kind"]], m["metadata"]["name"], "default"),
                [*objects, master],
            )
        )
        teardown = time.perf_counter() - teardown_started
    return {"submit_to_ready": ready - started, "teardown": teardown, "requests": len(double.requests())}


class CountingHandler(logging.Handler):
    """A task-log stand-in: formats every record (as Airflow's handlers do) and counts lines."""

    def __init__(self) -> None:
        super().__init__()
        self.lines = 0
        self.records = 0
        self.arrivals: list[tuple[float, str]] = []
        self.keep = False

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record)
        self.records += 1
        self.lines += text.count("\n") + 1
        if self.keep:
            now = time.time_ns()
            self.arrivals += [(now, line) for line in text.splitlines()]


def stream(double: Double, lines: int, rate: float, keep: bool = False) -> tuple[CountingHandler, float, float]:
    double.call("/_double/knobs", {"master_lines": lines, "master_rate": rate, "master_exit": 0})
    logger = logging.getLogger("bench.k8s.task")
    handler = CountingHandler()
    handler.keep = keep
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    first = [0.0]

    def emit(text: str) -> None:
        if "<stdout>:line" in text and not first[0]:
            first[0] = time.perf_counter()
        logger.info("%s", text)

    runner = JobRunner(backend_for(double), plan_for(2, "logs"), emit)
    runner.run()
    return handler, first[0], time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 10, 100, 1000])
    parser.add_argument("--flood", type=int, default=400_000)
    args = parser.parse_args()
    double = Double()
    try:
        print("workers  requests (budget N+10)  watches  submit->all Ready  last Ready->master created")
        for workers in args.sizes:
            figures = scale(double, workers)
            ready_ms = figures["ready_to_master"] * 1000
            print(
                f"{workers:>7}  {figures['requests']:>8.0f} ({figures['budget']:.0f}){'':>12}"
                f"{figures['watches']:>5.0f}  {figures['submit_to_ready']:>14.2f} s  {ready_ms:>18.1f} ms"
            )
        after_scale = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        handler, first, end = stream(double, args.flood, 0)
        flood_lines = args.flood
        print(
            f"log flood: {flood_lines} lines, {flood_lines / (end - first):,.0f} lines/s into the logger "
            f"({handler.records} records, {handler.lines / max(handler.records, 1):.0f} lines each)"
        )
        handler, _, _ = stream(double, 100, 20, keep=True)
        delays = sorted(
            (arrival - int(line.rsplit(" ", 1)[1])) / 1e6
            for arrival, line in handler.arrivals
            if "<stdout>:line" in line
        )
        print(
            f"log trickle (20 lines/s): delay print -> log p50 {statistics.median(delays):.1f} ms, "
            f"p99 {delays[int(len(delays) * 0.99) - 1]:.1f} ms, max {delays[-1]:.1f} ms"
        )
        for offset in (0.0, 2.5, -2.5):
            double.call("/_double/knobs", {"clock_offset": offset, "drop_log_streams": [2_000, 20]})
            handler, _, _ = stream(double, 60_000, 0, keep=True)
            got = [
                line.split("<stdout>:line ", 1)[1].split()[0] for _, line in handler.arrivals if "<stdout>:line" in line
            ]
            expected = [f"{i:08d}" for i in range(60_000)]
            duplicates = len(got) - len(set(got))
            lost = len(set(expected) - set(got))
            print(
                f"20 dropped streams, node clock {offset:+.1f} s: {len(got)} lines shown of 60000, "
                f"{duplicates} duplicates, {lost} lost, in order: {got == expected}"
            )
            double.call("/_double/knobs", {"clock_offset": 0.0})
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"operator process peak RSS: {after_scale:.0f} MB through the jobs above, {rss:.0f} MB at the end")
        print("  (the end includes this script's own record of 60k lines per skew run; target <= 300 MB)")
    finally:
        double.stop()


if __name__ == "__main__":
    logging.getLogger("airflow_mpi").setLevel(logging.WARNING)
    main()
