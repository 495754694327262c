"""Log streaming of the local backend into a task-style logger (prints figures; not a timed test).

1. flood: 3 ranks print N lines each as fast as they can; lines/s into the logger, records used,
   next to the same 3 processes writing the same lines to /dev/null.
2. trickle: one rank prints its clock every 50 ms; delay from print to log record (p50/p99/max).

    sudo .venv/bin/python bench/log_throughput.py [--lines 100000]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _state import STATE_DIR, remove_state_dir

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec


def task_logger(path: Path) -> logging.Logger:
    logger = logging.getLogger("bench.task")
    logger.handlers[:] = [logging.FileHandler(path)]
    logger.handlers[0].setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def run(command: list[str], workers: int, emit: object) -> float:
    spec = MPIJobSpec.from_dict({"name": "logbench", "command": command, "workers": {"replicas": workers}})
    plan = render_plan(spec, RunIdentity("bench", "log", f"r-{time.time_ns()}"))
    started = time.perf_counter()
    JobRunner(LocalBackend(state_dir=STATE_DIR), plan, emit).run()  # type: ignore[arg-type]
    return time.perf_counter() - started


FLOOD_CODE = "import sys\nw = sys.stdout.write\nfor i in range({lines}):\n    w(f'line {{i}} of the flood\\n')\n"


def flood(lines: int, log_path: Path) -> dict[str, float]:
    """3 ranks print ``lines`` each through the backend into the logger: lines/s in the streaming window."""
    logger = task_logger(log_path)
    counts = {"records": 0, "lines": 0, "first": 0.0, "last": 0.0}

    def emit(text: str) -> None:
        now = time.perf_counter()
        counts["first"] = counts["first"] or now
        counts["last"] = now
        counts["records"] += 1
        counts["lines"] += text.count("\n") + 1
        logger.info("%s", text)

    wall = run([sys.executable, "-c", FLOOD_CODE.format(lines=lines)], 2, emit)
    streamed = counts["last"] - counts["first"]
    return {"wall": wall, "window": streamed, "lines_per_s": counts["lines"] / streamed, **counts}


def to_devnull(lines: int) -> float:
    """The baseline: the same 3 processes writing the same lines straight to /dev/null (lines/s)."""
    code = FLOOD_CODE.format(lines=lines)
    started = time.perf_counter()
    with open(os.devnull, "w") as sink:
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=sink) for _ in range(3)]
        if any(proc.wait() != 0 for proc in procs):
            raise RuntimeError("a /dev/null writer failed")
    return 3 * lines / (time.perf_counter() - started)


def trickle(seconds: float) -> list[float]:
    delays: list[float] = []

    def emit(text: str) -> None:
        now = time.time()
        for line in text.splitlines():
            if "tick " in line:
                delays.append(now - float(line.rsplit(" ", 1)[1]))

    code = (
        "import time\n"
        f"for i in range(int({seconds} / 0.05)):\n    print('tick', repr(time.time()))\n    time.sleep(0.05)\n"
    )
    run([sys.executable, "-c", code], 0, emit)
    return sorted(delays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=100_000, help="lines per rank in the flood")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the trickle")
    args = parser.parse_args()
    log_path = Path("/var/tmp/airflow-mpi-bench-task.log")
    try:
        got = flood(args.lines, log_path)
    finally:
        log_path.unlink(missing_ok=True)
    print(f"flood: {3 * args.lines} rank lines in {got['wall']:.2f} s job wall; streaming window {got['window']:.2f} s")
    print(f"  {got['lines_per_s']:,.0f} lines/s into the logger, {got['records']:.0f} records")
    print(f"  the same lines to /dev/null: {to_devnull(args.lines):,.0f} lines/s")
    delays = trickle(args.seconds)
    print(
        f"trickle: {len(delays)} lines, print -> log record delay p50 {statistics.median(delays) * 1000:.1f} ms, "
        f"p99 {delays[int(len(delays) * 0.99) - 1] * 1000:.1f} ms, max {delays[-1] * 1000:.1f} ms"
    )


if __name__ == "__main__":
    try:
        main()
    finally:
        remove_state_dir()
