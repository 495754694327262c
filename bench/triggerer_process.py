"""A triggerer process for bench/deferred.py: only Airflow and the trigger imported, every trigger
(kwargs as JSON on stdin) in one event loop; one JSON line per event, then the peak RSS."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from airflow_mpi.triggers.mpi import MPIJobTrigger


def rss_mb(field: str = "VmRSS") -> float:
    """Resident memory now (VmRSS) or at its peak (VmHWM), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


async def one(kwargs: dict[str, Any]) -> None:
    async for event in MPIJobTrigger(contract=kwargs).run():
        payload = event.payload
        print(json.dumps({"job": payload["job_name"], "status": payload["status"], "at": time.time()}), flush=True)
        return


async def every(jobs: list[dict[str, Any]]) -> None:
    await asyncio.gather(*(one(kwargs) for kwargs in jobs))


def main() -> None:
    jobs = json.loads(sys.stdin.read())
    import kubernetes_asyncio.client  # noqa: F401 (what the trigger loads when it runs: in the baseline)

    print(json.dumps({"started": time.time(), "rss_before_mb": rss_mb()}), flush=True)
    asyncio.run(every(jobs))
    print(json.dumps({"rss_peak_mb": rss_mb("VmHWM")}), flush=True)


if __name__ == "__main__":
    main()
