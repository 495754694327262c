"""A triggerer-like process for bench/deferred_logs.py: every MPIJobTrigger (kwargs as JSON on
stdin) in one event loop, each following its master's log; the records the triggers write are
rendered to JSON, as a triggerer's runner sends them to its supervisor, and measured:
per job the lines (each numbered: none twice, none missing) and the delay from the line's own
clock to its record; the event loop's longest block (a 20 ms ticker, as Airflow's watchdog);
the peak RSS; and Airflow's own triggerer watchdog (``TriggerRunner.block_watchdog``, its
100 ms ticker and ``[triggerer] blocked_main_thread_warning_threshold``) in the same loop, whose
warnings ("Triggerer's async thread was blocked ...") are counted. Runs ``seconds`` then prints
one JSON object.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import structlog

JOB: contextvars.ContextVar[str] = contextvars.ContextVar("job", default="")
LINE = re.compile(r"line (\d{8}) (\d+)$")


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class Collector:
    def __init__(self, steady_after_ns: int) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.steady_after_ns = steady_after_ns  # delays of lines printed before: counted apart

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> Any:
        json.dumps(event, default=str)  # what the runner's JSON channel costs
        now = time.time_ns()
        job = self.jobs.setdefault(JOB.get(), {"lines": 0, "next": 0, "disorder": 0, "delays": [], "start_max": 0.0})
        for line in str(event.get("event", "")).split("\n"):
            found = LINE.search(line)
            if not found:
                continue
            number = int(found.group(1))
            job["disorder"] += number != job["next"]  # a line twice, missing or out of order
            job["next"] = number + 1
            job["lines"] += 1
            printed = int(found.group(2))
            if printed >= self.steady_after_ns:
                job["delays"].append((now - printed) / 1e9)
            else:
                job["start_max"] = max(job["start_max"], (now - printed) / 1e9)
        raise structlog.DropEvent


async def watchdog(worst: dict[str, list[float]], warmup: float) -> None:
    """The longest the loop did not run this ticker past its 20 ms, while the triggers start
    (``start``: the first ``warmup`` seconds) and after (``steady``): [seconds late, when (since
    the ticker started), of it CPU time of this thread (the rest: waiting for a CPU)]."""
    start = time.monotonic()
    while True:
        before, cpu = time.monotonic(), time.thread_time()
        await asyncio.sleep(0.02)
        late = time.monotonic() - before - 0.02
        phase = worst["start" if before - start < warmup else "steady"]
        if late > phase[0]:
            phase[:] = [late, before - start, time.thread_time() - cpu]


class WatchdogHost:
    """What Airflow's ``TriggerRunner.block_watchdog`` reads of its runner: its own method runs
    unchanged, and each warning it logs is counted (with when, to tell start from steady)."""

    def __init__(self, start: float) -> None:
        from airflow.configuration import conf

        self.stop = False
        self.blocked_main_thread_warning_threshold = conf.getfloat("triggerer", "blocked_main_thread_warning_threshold")
        self.start = start
        self.warnings: list[tuple[float, float]] = []  # (since start, seconds blocked)
        self.log = self

    async def ainfo(self, message: str, elapsed: float, *args: Any) -> None:
        self.warnings.append((time.monotonic() - self.start, elapsed))


async def one(kwargs: dict[str, Any]) -> None:
    from airflow_mpi.triggers.mpi import MPIJobTrigger

    JOB.set(kwargs["job_name"])
    async for _event in MPIJobTrigger(contract=kwargs).run():
        return


async def every(jobs: list[dict[str, Any]], seconds: float, warmup: float) -> dict[str, Any]:
    from airflow.jobs.triggerer_job_runner import TriggerRunner  # imported by main(), before "started"

    worst = {"start": [0.0, 0.0, 0.0], "steady": [0.0, 0.0, 0.0]}
    ticker = asyncio.create_task(watchdog(worst, warmup))
    host = WatchdogHost(time.monotonic())
    airflow_watchdog = asyncio.create_task(TriggerRunner.block_watchdog(host))  # type: ignore[arg-type]
    tasks = [asyncio.create_task(one(kwargs)) for kwargs in jobs]
    await asyncio.wait(tasks, timeout=seconds)
    ended = sum(task.done() for task in tasks)
    host.stop = True
    for task in [*tasks, ticker, airflow_watchdog]:
        task.cancel()
    results = await asyncio.gather(*tasks, ticker, airflow_watchdog, return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, Exception)]
    warned = {
        "threshold_s": host.blocked_main_thread_warning_threshold,
        "start": [blocked for at, blocked in host.warnings if at < warmup],
        "steady": [blocked for at, blocked in host.warnings if at >= warmup],
    }
    return {"loop_block": worst, "airflow_watchdog": warned, "ended": ended, "errors": errors[:3]}


def main() -> None:
    spec = json.loads(sys.stdin.read())
    import kubernetes_asyncio.client  # noqa: F401 (loaded by the triggers: in the baseline)
    from airflow.jobs.triggerer_job_runner import TriggerRunner  # noqa: F401 (its watchdog runs in the loop)

    import airflow_mpi.triggers.mpi  # noqa: F401

    collector = Collector(time.time_ns() + int(spec["warmup"] * 1e9))
    structlog.configure(processors=[collector])  # after Airflow's import, which configures its own

    print(json.dumps({"started": time.time(), "rss_before_mb": rss_mb()}), flush=True)
    if spec.get("debug"):
        import logging

        logging.getLogger("asyncio").addHandler(logging.StreamHandler(sys.stderr))
        logging.getLogger("asyncio").setLevel(logging.WARNING)
    got = asyncio.run(every(spec["jobs"], spec["seconds"], spec["warmup"]), debug=bool(spec.get("debug")))
    got["rss_peak_mb"] = rss_mb("VmHWM")
    got["jobs"] = {
        job: {
            "lines": data["lines"],
            "disorder": data["disorder"],
            "delay_max_s": max(data["delays"], default=0.0),
            "delay_starting_max_s": data["start_max"],
            "delay_p99_s": sorted(data["delays"])[int(len(data["delays"]) * 0.99) - 1] if data["delays"] else 0.0,
        }
        for job, data in collector.jobs.items()
    }
    print(json.dumps(got), flush=True)


if __name__ == "__main__":
    main()
