"""An operator in a process of its own, so its memory can be measured apart from the test (and
from the API double, which holds the whole log): runs one job through ``JobRunner`` on the local
backend or against a Kubernetes API double, writes the task log to a file, and prints one JSON
object: RSS before the job, its peak during the job (VmHWM after a reset), records and lines.

    python -m tests.output_probe --backend kubernetes --url http://127.0.0.1:PORT --spec '{...}' --log FILE
    python -m tests.output_probe --backend local --state-dir DIR --spec '{...}' --log FILE
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def status_kb(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmRSS: now; VmHWM: the peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> None:
    """Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def backend_for(args: argparse.Namespace) -> Any:
    if args.backend == "local":
        from airflow_mpi.backends.local import LocalBackend

        return LocalBackend(state_dir=args.state_dir)
    from kubernetes import client

    from airflow_mpi.backends.kubernetes import KubernetesBackend

    configuration = client.Configuration()
    configuration.host = args.url
    return KubernetesBackend(api_client=client.ApiClient(configuration), namespace="default")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["local", "kubernetes"], required=True)
    parser.add_argument("--url", default="")
    parser.add_argument("--state-dir", default="")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)

    from airflow_mpi.job.naming import RunIdentity
    from airflow_mpi.job.plan import render_plan
    from airflow_mpi.runner.job import JobRunner
    from airflow_mpi.spec import MPIJobSpec

    plan = render_plan(MPIJobSpec.from_dict(json.loads(args.spec)), RunIdentity("probe", "train", uuid.uuid4().hex))
    backend = backend_for(args)
    counts = {"records": 0, "lines": 0, "longest": 0}
    with open(args.log, "w", encoding="utf-8") as log:

        def emit(text: str) -> None:
            counts["records"] += 1
            counts["lines"] += text.count("\n") + 1
            counts["longest"] = max(counts["longest"], max(len(line) for line in text.split("\n")))
            log.write(text + "\n")

        options: dict[str, Any] = {}
        if "warn" in inspect.signature(JobRunner).parameters:  # older versions had no warn
            options["warn"] = emit
        runner = JobRunner(backend, plan, emit, **options)
        reset_peak()
        before = status_kb("VmRSS")
        started = time.monotonic()
        error = ""
        try:
            runner.run()
        except Exception as failure:  # reported, not raised: the caller asserts on it
            error = f"{type(failure).__name__}: {failure}"
        peak = status_kb("VmHWM")
    report = {
        "rss_before_kb": before,
        "rss_peak_kb": peak,
        "growth_kb": peak - before,
        "seconds": round(time.monotonic() - started, 2),
        "error": error,
        **counts,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
