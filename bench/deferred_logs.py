"""Deferred jobs whose master logs are followed live: N MPIJobTriggers in one triggerer-like
process (bench/log_triggerer_process.py), each master printing ``rate`` lines a second on the API
double (its own process), optionally one more job flooding its log as fast as the double can.

Measured: each line's delay from its own clock to its task-log record (max over the steady
jobs), lines out of order / twice / missing, the event loop's longest block, the process's peak
RSS; for the flood, the lines it got through in the window (the rest wait in the pod's log).
Baseline: the same jobs in waiting mode need one worker process each; one such process (Airflow,
the operator and the backend imported, following one job's log at the same rate) is measured.

``separate_cpus``: the API double (100 masters printing and a flood: a cluster's work) on one CPU
and the triggerer on another, as in a deployment where the API server is not on the triggerer's
machine. Without it both share this machine's CPUs, and the loop's longest block is mostly time
spent waiting for a CPU (the figure beside it says how much of it was the loop's own CPU time).

    .venv/bin/python bench/deferred_logs.py [--jobs 100] [--rate 20] [--seconds 20] [--flood]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deferred import start_triggerer, trigger_kwargs
from k8s_double import Double, backend_for, plan_for

from airflow_mpi.observe.master_output import OutputPlan
from airflow_mpi.runner.job import JobRunner

WARMUP = 3.0  # seconds in which the triggers start and the masters are released: blocks counted apart


def measure(
    double: Double, jobs: int, rate: float, seconds: float, flood: bool, separate_cpus: bool = False
) -> dict[str, Any]:
    """Create the jobs (masters held), start the process with every trigger following its
    master's log, release the masters, and read what the process measured."""
    double.call("/_double/reset", {})
    lines = int(rate * (seconds + 30))  # more than the window: every master still prints at its end
    knobs = {"master_lines": lines, "master_rate": rate, "master_exit": 0, "hold_masters": True}
    double.call("/_double/knobs", {**knobs, "flood_job": "flood" if flood else None, "flood_lines": 2_000_000})
    backend = backend_for(double)
    runners, kwargs = [], []
    proc: subprocess.Popen[str] | None = None
    try:
        names = [f"l{i}" for i in range(jobs)] + (["flood"] if flood else [])
        for name in names:
            runner = JobRunner(backend, plan_for(1, name), lambda _text: None)
            runners.append(runner)
            runner.create()
            runner.wait_ready()
            runner.start_master()
            backend.release(runner.job_name)
            args = trigger_kwargs(runner)
            args["master_log"] = OutputPlan.from_plan(runner.plan).to_dict()
            kwargs.append(args)
        payload = {
            "jobs": kwargs,
            "seconds": seconds,
            "warmup": WARMUP,
            "debug": bool(os.environ.get("BENCH_ASYNCIO_DEBUG")),
        }
        proc = start_triggerer(double, [], script="log_triggerer_process.py", payload=payload)
        if separate_cpus:
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(double.proc.pid, {cpus[0]})
            os.sched_setaffinity(proc.pid, {cpus[-1]})
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        time.sleep(1.0)  # every trigger opens its stream
        double.call("/_double/knobs", {"hold_masters": False})
        got = last_json(proc.stdout)
        proc.wait(60)
    finally:
        if separate_cpus:
            os.sched_setaffinity(double.proc.pid, os.sched_getaffinity(0))
        double.call("/_double/knobs", {"hold_masters": False, "flood_job": None})
        if proc is not None and proc.poll() is None:
            proc.kill()
        for runner in runners:
            runner.teardown()
    per_job = got["jobs"]
    steady = [data for job, data in per_job.items() if "flood" not in job]
    flooded = next((data for job, data in per_job.items() if "flood" in job), None)
    return {
        "jobs": jobs,
        "rate": rate,
        "seconds": seconds,
        "steady_jobs_seen": len(steady),
        "steady_lines_min": min((d["lines"] for d in steady), default=0),
        "delay_max_s": max((d["delay_max_s"] for d in steady), default=0.0),
        "delay_p99_max_s": max((d["delay_p99_s"] for d in steady), default=0.0),
        "delay_starting_max_s": max((d["delay_starting_max_s"] for d in steady), default=0.0),
        "disorder": sum(d["disorder"] for d in per_job.values()),
        "loop_block_max_s": got["loop_block"]["steady"][0],
        "loop_block_cpu_s": got["loop_block"]["steady"][2],
        "loop_block_starting_s": got["loop_block"]["start"][0],
        "airflow_warnings_steady": len(got["airflow_watchdog"]["steady"]),
        "airflow_warnings_starting": len(got["airflow_watchdog"]["start"]),
        "airflow_warning_threshold_s": got["airflow_watchdog"]["threshold_s"],
        "separate_cpus": separate_cpus,
        "rss_before_mb": started["rss_before_mb"],
        "rss_peak_mb": got["rss_peak_mb"],
        "flood_lines": flooded["lines"] if flooded else None,
        "flood_lag_max_s": max(flooded["delay_max_s"], flooded["delay_starting_max_s"]) if flooded else None,
        "errors": got.get("errors", []),
        "ended": got.get("ended"),
    }


def last_json(stream: Any) -> dict[str, Any]:
    """The process's result: its first line that is a JSON object (the rest is its log)."""
    skipped = []
    for line in stream:
        if line.startswith("{"):
            return dict(json.loads(line))
        skipped.append(line)
    raise RuntimeError("the triggerer process gave no result: " + "".join(skipped[-20:]))


def waiting_process_rss(double: Double, rate: float, seconds: float = 3.0) -> float:
    """Peak RSS of one waiting-mode process: Airflow's SDK, the operator and the synchronous
    backend imported, one job's master log followed into a logger at ``rate`` lines a second."""
    double.call("/_double/reset", {})
    double.call("/_double/knobs", {"master_lines": int(rate * seconds), "master_rate": rate, "hold_masters": False})
    code = (
        "import sys, json, logging\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import airflow.sdk, airflow_mpi.operators.mpi\n"
        "from k8s_double import backend_for, plan_for\n"
        "from airflow_mpi.runner.job import JobRunner\n"
        "class D: url = sys.argv[2]\n"
        "log = logging.getLogger('task')\n"
        "JobRunner(backend_for(D()), plan_for(1, 'waiting'), log.info).run()\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), double.url],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return int(done.stdout.split()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--flood", action="store_true")
    parser.add_argument("--separate-cpus", action="store_true", help="the double on one CPU, the triggerer on another")
    args = parser.parse_args()
    double = Double()
    try:
        got = measure(double, args.jobs, args.rate, args.seconds, args.flood, args.separate_cpus)
        got["waiting_process_rss_mb"] = waiting_process_rss(double, args.rate)
        print(json.dumps(got, indent=1))
    finally:
        double.stop()


if __name__ == "__main__":
    main()
