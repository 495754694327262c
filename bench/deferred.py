"""Deferred jobs: 100 MPIJobTriggers waiting at once in one triggerer process (asyncio), against
scripted pods on the API double (its own process).

The jobs' pods are created first (workers Ready, masters held running by the double); then a
separate triggerer process (only Airflow and the trigger imported) runs every trigger; once every
trigger watches, requests are counted over a quiet window, then every master ends at once.
Measured: the triggerer's peak RSS next to the same process before any trigger ran, API
requests per job while waiting, and the delay from a master's exit (the clock in its last line,
printed just before the double marks it terminated) to its trigger's event (p50/p99).

    .venv/bin/python bench/deferred.py [--jobs 100] [--quiet 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from k8s_double import Double, backend_for, plan_for

from airflow_mpi.runner.job import JobRunner


def master_exit_time(double: Double, pod: str) -> float:
    """When the master ended, on the double's clock (the same machine clock the triggerer reads):
    its one line carries ``time.time_ns()`` as the script printed it, and the double marks the pod
    terminated right after that line. Not a second watcher's arrival time: the double fans each
    event out to every watch in turn, so an observer's copy can arrive after the trigger's."""
    with urllib.request.urlopen(f"{double.url}/api/v1/namespaces/default/pods/{pod}/log") as response:
        last = response.read().decode().strip().splitlines()[-1]
    return int(last.rsplit(" ", 1)[1]) / 1e9


def measure(double: Double, jobs: int, quiet: float = 5.0) -> dict[str, Any]:
    """Create the jobs (masters held running), start the triggerer, wait until every trigger
    watches, count requests over ``quiet`` seconds, then end every master and time the events."""
    double.call("/_double/reset", {})
    double.call("/_double/knobs", {"master_lines": 1, "master_rate": 0, "master_exit": 0, "hold_masters": True})
    backend = backend_for(double)
    runners, kwargs = [], []
    proc: subprocess.Popen[str] | None = None
    try:
        for i in range(jobs):
            runner = JobRunner(backend, plan_for(1, f"d{i}"), lambda _text: None)
            runners.append(runner)
            runner.create()
            runner.wait_ready()
            runner.start_master()
            backend.release(runner.job_name)  # the operator defers: its own watch ends here
            kwargs.append(trigger_kwargs(runner))
        proc = start_triggerer(double, kwargs)
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        before = len(double.requests())
        deadline = time.monotonic() + 300
        while (watching := watched_jobs(double.requests()[before:])) < jobs:  # a trigger re-watches after 60 s
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"only {watching} of {jobs} triggers started watching")
            time.sleep(0.1)
        all_watching = time.time() - started["started"]
        settled = len(double.requests())
        time.sleep(quiet)
        during_quiet = len(double.requests()) - settled
        waited = time.time() - started["started"]
        total_waiting = len(double.requests()) - before
        double.call("/_double/knobs", {"hold_masters": False})
        fired: dict[str, dict[str, Any]] = {}
        peak: dict[str, float] = {}
        for line in proc.stdout:
            record = json.loads(line)
            if "job" in record:
                fired[record["job"]] = record
            else:
                peak.update(record)
        proc.wait(60)
        ended = {r.job_name: master_exit_time(double, r.plan.master.name) for r in runners}
    finally:
        double.call("/_double/knobs", {"hold_masters": False})
        if proc is not None and proc.poll() is None:
            proc.kill()
        for runner in runners:
            runner.teardown()
    if proc.returncode != 0 or len(fired) != jobs:
        raise RuntimeError(f"triggerer exited {proc.returncode} with {len(fired)} of {jobs} events")
    failed = [r for r in fired.values() if r["status"] != "finished"]
    if failed:
        raise RuntimeError(f"{len(failed)} triggers did not see their job finish: {failed[:3]}")
    delays = sorted(fired[job]["at"] - at for job, at in ended.items())
    return {
        "jobs": jobs,
        "rss_before_mb": started["rss_before_mb"],
        "rss_peak_mb": peak["rss_peak_mb"],
        "requests_per_job_waiting": total_waiting / jobs,
        "requests_in_quiet_window": during_quiet,
        "waited_s": waited,
        "all_watching_s": all_watching,
        "delay_p50_s": statistics.median(delays),
        "delay_p99_s": delays[max(0, int(len(delays) * 0.99) - 1)],
        "delay_max_s": delays[-1],
    }


def watched_jobs(requests: list[list[str]]) -> int:
    """How many jobs have a watch among these requests (the label selector names the job)."""
    watches = [path for _, path in requests if "watch=" in path]
    return len({parse_qs(urlparse(path).query).get("labelSelector", [""])[0] for path in watches})


def trigger_kwargs(runner: JobRunner) -> dict[str, Any]:
    """The wait the operator hands the triggerer when it defers (a ``WaitContract``'s fields)."""
    return {
        "job_name": runner.job_name,
        "namespace": "default",
        "kubernetes_conn_id": "kube_double",
        "api_timeout": 120.0,
        "deadline": time.time() + 600,
        "worker_pods": [w.name for w in runner.plan.workers],
        "master_pod": runner.plan.master.name,
        "timeout": 600.0,
    }


def start_triggerer(
    double: Double, kwargs: list[dict[str, Any]], *, script: str = "triggerer_process.py", payload: Any = None
) -> subprocess.Popen[str]:
    """A process running ``script`` with the double's connection; it reads ``payload`` (default:
    the triggers' kwargs) as JSON on stdin."""
    env = dict(os.environ)
    env["AIRFLOW_CONN_KUBE_DOUBLE"] = double.kube_connection()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name(script))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(kwargs if payload is None else payload))
    proc.stdin.close()
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--quiet", type=float, default=5.0, help="seconds of waiting in which requests are counted")
    args = parser.parse_args()
    double = Double()
    try:
        print(json.dumps(measure(double, args.jobs, args.quiet), indent=1))
    finally:
        double.stop()


if __name__ == "__main__":
    main()
