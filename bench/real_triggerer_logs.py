"""Deferred jobs' live logs through Airflow's real triggerer: N ``MPIJobOperator(deferrable=True)``
tasks (one more flooding its log) run by Airflow's own processes (scheduler, dag-processor,
api-server, triggerer; LocalExecutor; a fresh home and SQLite database) against the API double
in its own process. Once every task is deferred, the masters start printing ``rate`` lines a
second, each ending with its own clock; for ``seconds`` the triggerer follows them all.

Measured from what Airflow itself wrote: each line's delay from its clock to its record in the
task try's trigger log file (``*.log.trigger.<id>.log``, the file the UI and the REST API read),
lines out of order / twice / missing per task, the triggerer's own warnings "Triggerer's async
thread was blocked" (its watchdog, ``[triggerer] blocked_main_thread_warning_threshold``), the
peak RSS of the triggerer (its supervisor and its trigger runner process together), and where the
machine's CPUs went over the window (``/proc``: each Airflow process, the trigger runner apart
from its supervisor, the API double).

    .venv/bin/python bench/real_triggerer_logs.py [--jobs 100] [--rate 20] [--seconds 20] \
        [--loop-stats] [--triggerer-cpu]

``--triggerer-cpu`` puts the triggerer (supervisor and runner) on a CPU of its own and every other
process on the rest, as a deployment runs it (its own pod; the API server elsewhere).

``--loop-stats`` times every step of the triggerer's event loop (``bench/loopstat``) and splits
the long ones' time into on a CPU, waiting for a CPU, and blocked in a system call: whether a
"blocked" warning is a trigger's own work or the machine's other processes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from k8s_double import Double

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.airflow_processes import Airflow, airflow_processes, descendants, wait_for  # noqa: E402

DAG_ID = "bench_deferred_logs"
LINE = re.compile(r"line (\d{8}) (\d+)$")
BLOCKED = re.compile(r"Triggerer's async thread was blocked for ([\d.]+) seconds")
WARMUP = 3.0  # seconds after the release in which every trigger's stream starts: counted apart

DAG_FILE = """
from datetime import datetime
from airflow.sdk import DAG
from airflow_mpi.operators.mpi import MPIJobOperator

NAMES = {names!r}
with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_tasks=1000):
    for name in NAMES:
        MPIJobOperator(
            task_id=name,
            job={{"name": name, "image": "registry.example/train:1", "command": ["python", "t.py"],
                 "workers": {{"replicas": 1}}, "startup_timeout": 900, "timeout": 7200}},
            mpi_conn_id="mpi_bench",
            deferrable=True,
            retries=0,
        )
"""


def connections(double: Double) -> dict[str, str]:
    mpi = {"conn_type": "mpi", "extra": {"backend": "kubernetes", "kubernetes_conn_id": "kube_double"}}
    return {"AIRFLOW_CONN_KUBE_DOUBLE": double.kube_connection(), "AIRFLOW_CONN_MPI_BENCH": json.dumps(mpi)}


def with_master(double: Double) -> set[str]:
    """The tasks whose master pod exists: a task defers first for its workers to be ready, then
    (its master created) for the job to finish; only the second follows a log."""
    request = urllib.request.Request(double.url + "/api/v1/namespaces/default/pods")
    request.add_header("Authorization", "Bearer double-token")
    with urllib.request.urlopen(request, timeout=30) as response:
        pods = json.loads(response.read())["items"]
    return {pod["metadata"]["name"].split("-")[0] for pod in pods if "-master-" in pod["metadata"]["name"]}


def task_states(home: Path) -> dict[str, str]:
    with sqlite3.connect(home / "airflow.db", timeout=30) as db:
        rows = db.execute("select task_id, state from task_instance where dag_id = ?", (DAG_ID,))
        return {str(task): str(state) for task, state in rows}


def settled(double: Double, home: Path) -> dict[str, str] | None:
    """Every task deferred following its master, or failed; None while any is on its way. (Under
    load, Airflow 3.3 fails some resumed tasks: a stale executor event from the deferral's exit
    meets the resumed try, apache/airflow#72716; those are counted, not measured.)"""
    states = task_states(home)
    if not states or set(states.values()) - {"deferred", "failed"}:
        return None
    deferred = {task for task, state in states.items() if state == "deferred"}
    return states if deferred <= with_master(double) else None


class RssSampler(threading.Thread):
    """The triggerer's RSS (the process and its children: the trigger runner), every 0.5 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_mb, self.stop = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.peak_mb = max(self.peak_mb, self.sample())

    def sample(self) -> float:
        total = 0
        for pid in [self.pid, *descendants(self.pid)]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            found = re.search(r"VmRSS:\s+(\d+)", status)
            total += int(found[1]) if found else 0
        return total / 1024


class FileTailer(threading.Thread):
    """When each byte of the trigger log files reached the disk: every ``POLL`` seconds, the size
    of each file (the record's own time is the runner's, taken before its write to the supervisor;
    this is when the UI and the REST API can read it)."""

    POLL = 0.1

    def __init__(self, logs: Path) -> None:
        super().__init__(daemon=True)
        self.logs, self.stop = logs, threading.Event()
        self.sizes: dict[Path, list[tuple[int, float]]] = {}  # per file: (size, first seen at)

    def run(self) -> None:
        files: list[Path] = []
        polls = 0
        while not self.stop.wait(self.POLL):
            if polls % 10 == 0:  # new files (a trigger's first record) once a second
                files = sorted(self.logs.rglob("*.trigger.*.log"))
            polls += 1
            now = time.time()
            for path in files:
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                seen = self.sizes.setdefault(path, [])
                if not seen or size > seen[-1][0]:
                    seen.append((size, now))

    def arrival(self, path: Path, end: int) -> float | None:
        """When the file first held ``end`` bytes (None: not seen while polling)."""
        for size, at in self.sizes.get(path, []):
            if size >= end:
                return at
        return None


def read_trigger_logs(home: Path, steady_after_ns: int, tailer: FileTailer | None = None) -> dict[str, dict[str, Any]]:
    """Per task: the lines its trigger log files hold (in order), their delays to their
    record's time and (``tailer``) to the file."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((home / "logs").rglob("*.trigger.*.log")):
        task = re.search(r"task_id=([^/]+)", str(path))[1]  # type: ignore[index]
        empty = {"lines": 0, "next": 0, "disorder": 0, "delays": [], "to_file": [], "start_max": 0.0}
        job = found.setdefault(task, empty)
        end = 0
        for raw in path.read_bytes().splitlines(keepends=True):
            end += len(raw)
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            stamp = record.get("timestamp")
            if not stamp:
                continue
            at = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
            arrived = tailer.arrival(path, end) if tailer is not None else None
            for line in str(record.get("event", "")).split("\n"):
                hit = LINE.search(line)
                if not hit:
                    continue
                number, printed = int(hit[1]), int(hit[2])
                job["disorder"] += number != job["next"]
                job["next"] = number + 1
                job["lines"] += 1
                delay = at - printed / 1e9
                if printed >= steady_after_ns:
                    job["delays"].append(delay)
                    if arrived is not None:
                        job["to_file"].append(arrived - printed / 1e9)
                else:
                    job["start_max"] = max(job["start_max"], delay)
    return found


def blocked_warnings(airflow: Airflow, released: float) -> dict[str, list[Any]]:
    """The triggerer's watchdog warnings, while the streams start and after (``"when"``: the
    steady ones' (time, lag))."""
    text = (airflow.home / "triggerer.out").read_text(errors="replace")
    got: dict[str, list[Any]] = {"start": [], "steady": [], "when": []}
    for line in text.splitlines():
        hit = BLOCKED.search(line)
        stamp = re.match(r"(\d{4}-\d\d-\d\dT[\d:.]+Z?)", line)
        if not hit:
            continue
        at = datetime.datetime.fromisoformat(stamp[1].replace("Z", "+00:00")).timestamp() if stamp else released
        if at >= released:
            got["steady" if at >= released + WARMUP else "start"].append(float(hit[1]))
            if at >= released + WARMUP:
                got["when"].append((at, float(hit[1])))
    return got


def long_steps(path: Path, released: float, warnings: list[tuple[float, float]]) -> dict[str, Any]:
    """The event loop's steps over 0.1 s after the streams started (``bench/loopstat``): how
    many, and where their time went; and over each watchdog warning's lag (``warnings``: when,
    how long), the loop thread's time on a CPU and waiting for one."""
    every = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    ticks = [row for row in every if row.get("tick")]
    rows = [row for row in every if not row.get("tick") and row["at"] >= released + WARMUP]
    lagged = {"seconds": 0.0, "cpu": 0.0, "runqueue": 0.0}
    for at, lag in warnings:
        for tick in ticks:
            if at - lag - 0.05 <= tick["at"] <= at + 0.05:
                for key in lagged:
                    lagged[key] += tick[key]
    wall = sum(row["wall"] for row in rows)
    cpu = sum(row["cpu"] for row in rows)
    runqueue = sum(row["runqueue"] for row in rows)
    follows = [row for row in rows if "name='log-" in row["what"]]
    return {
        "steps": len(rows),
        "longest_s": max((row["wall"] for row in rows), default=0.0),
        "longest_cpu_s": max((row["cpu"] for row in rows), default=0.0),
        "wall_s": wall,
        "on_cpu_s": cpu,
        "waiting_for_cpu_s": runqueue,
        "blocked_s": max(0.0, wall - cpu - runqueue),
        "log_follow_steps": len(follows),
        "warned_lag_s": sum(lag for _, lag in warnings),
        "warned_ticks": lagged,
        "longest": [
            {key: row[key] for key in ("wall", "cpu", "runqueue", "what", "stack")}
            for row in sorted(rows, key=lambda row: -row["wall"])[:3]
        ],
    }


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) of these processes (each its own, not its children's), in seconds."""
    total = 0
    for process in pids:
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> dict[str, float]:
    """The machine's CPU time so far, busy and stolen by the hypervisor (``/proc/stat``), in seconds."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return {"busy": (user + nice + system + irq + softirq) / tick, "steal": steal / tick}


class CpuWindow:
    """Where the machine's CPUs went over a window: each of Airflow's processes with its children
    (the executor's workers), the triggerer's supervisor and its trigger runner apart, the API
    double, and the rest of the machine."""

    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = {name: [pid, *descendants(pid)] for name, pid in procs.items() if name != "triggerer"}
        if "triggerer" in procs:
            self.procs["triggerer_supervisor"] = [procs["triggerer"]]
            self.procs["trigger_runner"] = descendants(procs["triggerer"])
        self.start = {name: cpu_seconds(pids) for name, pids in self.procs.items()}
        self.machine, self.at = machine_cpu(), time.monotonic()

    def end(self) -> dict[str, float]:
        seconds = time.monotonic() - self.at
        used = {name: (cpu_seconds(pids) - self.start[name]) / seconds for name, pids in self.procs.items()}
        machine = {key: (value - self.machine[key]) / seconds for key, value in machine_cpu().items()}
        used["other"] = machine["busy"] - sum(used.values())
        return {
            **{f"{name}_cpus": round(value, 3) for name, value in used.items()},
            "machine_busy_cpus": round(machine["busy"], 3),
            "steal_cpus": round(machine["steal"], 3),
        }


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` and of its descendants onto ``cpus``."""
    for process in (pid, *descendants(pid)):
        for task in Path(f"/proc/{process}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except OSError:
                pass  # ended meanwhile


def measure(
    jobs: int,
    rate: float,
    seconds: float,
    parallelism: int = 8,
    loop_stats: bool = False,
    triggerer_cpu: bool = False,
) -> dict[str, Any]:
    names = [f"l{i}" for i in range(jobs)] + ["flood"]
    double = Double()
    try:
        lines = int(rate * (seconds + 120))  # more than the window: every master still prints at its end
        knobs = {"master_lines": lines, "master_rate": rate, "master_exit": 0, "hold_masters": True}
        double.call("/_double/knobs", {**knobs, "flood_job": "flood", "flood_lines": 5_000_000})
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
            home = Path(tmp) / "home"
            dags = {"bench_dag.py": DAG_FILE.format(names=names, dag_id=DAG_ID)}
            settings = {"AIRFLOW__CORE__PARALLELISM": str(parallelism), "AIRFLOW__TRIGGERER__CAPACITY": "1000"}
            env, steps_file = connections(double), Path(tmp) / "loop-steps.jsonl"
            if loop_stats:  # PYTHONPATH comes from this process's environment
                os.environ["PYTHONPATH"] = os.pathsep.join(
                    filter(None, [str(Path(__file__).parent / "loopstat"), os.environ.get("PYTHONPATH", "")])
                )
                env["AIRFLOW_MPI_LOOP_STATS"] = str(steps_file)
            with airflow_processes(home, dags, env=env, **settings) as airflow:
                started = time.monotonic()
                wait_for("the DAG parsed", lambda: airflow.get(f"/api/v2/dags/{DAG_ID}"), 180, airflow)
                sampler = RssSampler(airflow.procs["triggerer"].pid)
                idle_mb = sampler.sample()  # no trigger yet: the triggerer as it starts
                airflow.patch(f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
                airflow.post(f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None})
                at_start = wait_for("every task following its master", lambda: settled(double, home), 1200, airflow)
                following = sorted(task for task, state in at_start.items() if state == "deferred")
                all_deferred_s = time.monotonic() - started
                if triggerer_cpu:  # the triggerer on a CPU of its own; everything else on the others
                    cpus = sorted(os.sched_getaffinity(0))
                    for name, proc in airflow.procs.items():
                        pin(proc.pid, {cpus[-1]} if name == "triggerer" else set(cpus[:-1]))
                    pin(double.proc.pid, set(cpus[:-1]))
                sampler.start()
                tailer = FileTailer(home / "logs")
                tailer.start()
                time.sleep(2.0)  # every trigger has its stream open on a held master
                released = time.time()
                double.call("/_double/knobs", {"hold_masters": False})
                time.sleep(WARMUP)
                window = CpuWindow({**{n: p.pid for n, p in airflow.procs.items()}, "api_double": double.proc.pid})
                time.sleep(seconds)
                cpu_use = window.end()
                sampler.stop.set()
                tailer.stop.set()
                tailer.join()
                per_task = read_trigger_logs(home, int((released + WARMUP) * 1e9), tailer)
                warned = blocked_warnings(airflow, released)
                final_states = task_states(home)
                steps = long_steps(steps_file, released, warned["when"]) if loop_stats else None
                if os.environ.get("BENCH_KEEP"):  # for a look at what Airflow wrote
                    shutil.copytree(home, os.environ["BENCH_KEEP"], dirs_exist_ok=True)
    finally:
        double.stop()
    steady = [data for task, data in per_task.items() if task != "flood" and task in following]
    flooded = per_task.get("flood", {"lines": 0, "delays": [], "start_max": 0.0})
    return {
        "jobs": jobs,
        "rate": rate,
        "seconds": seconds,
        "released_s": WARMUP + seconds,  # from the masters' release to the logs' read
        "all_deferred_s": all_deferred_s,
        "failed_before_following": sorted(task for task in names if task not in following),
        "states_at_end": {state: list(final_states.values()).count(state) for state in set(final_states.values())},
        "steady_jobs_seen": len(steady),
        "steady_lines_min": min((d["lines"] for d in steady), default=0),
        "delay_max_s": max((max(d["delays"], default=0.0) for d in steady), default=0.0),
        "delay_to_file_max_s": max((max(d["to_file"], default=0.0) for d in steady), default=0.0),
        "delay_starting_max_s": max((d["start_max"] for d in steady), default=0.0),
        "disorder": sum(d["disorder"] for d in per_task.values()),
        "blocked_warnings_steady": warned["steady"],
        "blocked_warnings_starting": warned["start"],
        "rss_idle_mb": idle_mb,
        "rss_peak_mb": sampler.peak_mb,
        "flood_lines": flooded["lines"],
        "triggerer_cpu": triggerer_cpu,
        "cpu_use_steady": cpu_use,
        **({"loop_long_steps": steps} if steps is not None else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--parallelism", type=int, default=8)
    parser.add_argument("--loop-stats", action="store_true", help="split the event loop's long steps' time")
    parser.add_argument("--triggerer-cpu", action="store_true", help="the triggerer alone on one CPU")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still ends Airflow and the double
    got = measure(args.jobs, args.rate, args.seconds, args.parallelism, args.loop_stats, args.triggerer_cpu)
    print(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
