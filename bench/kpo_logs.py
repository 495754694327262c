"""The master's log through this project's Kubernetes log path and through KubernetesPodOperator's
(the cncf provider's ``PodManager.fetch_container_logs(..., follow=True)``, as installed, not
patched), both against the same API double, into the same kind of task logger: lines per second,
duplicated lines, lost lines. The double cuts streams on request and skews the node's clock.

    .venv/bin/python bench/kpo_logs.py [--lines 200000]
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass

from k8s_double import CountingHandler, Double, backend_for, plan_for, stream
from kubernetes import client

from airflow_mpi.runner.job import JobRunner

DROP_RATE = 5_000.0  # lines/s the master prints while its log streams are being cut


@dataclass(frozen=True)
class Tally:
    shown: int  # lines of the master's output that reached the logger
    duplicated: int
    lost: int
    in_order: bool
    lines_per_s: float


def tally(handler: CountingHandler, expected: int) -> Tally:
    """What reached the logger, against the ``expected`` numbered lines the master printed."""
    arrivals = [(at, line) for at, line in handler.arrivals if "<stdout>:line " in line]
    got = [line.split("<stdout>:line ", 1)[1].split()[0] for _, line in arrivals]
    seen = set(got)
    window = (arrivals[-1][0] - arrivals[0][0]) / 1e9 if len(arrivals) > 1 else 0.0
    return Tally(
        shown=len(got),
        duplicated=len(got) - len(seen),
        lost=sum(1 for i in range(expected) if f"{i:08d}" not in seen),
        in_order=got == sorted(got),
        lines_per_s=len(got) / window if window else 0.0,
    )


def kpo_stream(double: Double, lines: int, rate: float = 0) -> CountingHandler:
    """Create the job's pods through the backend, then let PodManager follow the master's log."""
    from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager

    double.call("/_double/knobs", {"master_lines": lines, "master_rate": rate, "master_exit": 0})
    backend = backend_for(double)
    runner = JobRunner(backend, plan_for(2, "kpo"), lambda _text: None)
    handler = CountingHandler()
    handler.keep = True
    logger = logging.getLogger("bench.kpo.task")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        runner.create()
        runner.wait_ready()
        runner.start_master()
        core = client.CoreV1Api(backend.api_client)
        pod = core.read_namespaced_pod(runner.plan.master.name, "default")
        manager = PodManager(kube_client=core)
        manager._log = logger  # the task's logger, as Airflow gives each task its own
        manager.fetch_container_logs(pod, pod.spec.containers[0].name, follow=True)
    finally:
        runner.teardown()
    return handler


def ours(double: Double, lines: int, rate: float = 0) -> CountingHandler:
    handler, _, _ = stream(double, lines, rate, keep=True)
    return handler


def with_drops(double: Double, read: object, lines: int, drops: int, offset: float, rate: float = DROP_RATE) -> Tally:
    """``drops`` streams cut every ``lines // (drops + 1)`` lines, with the node's clock ``offset`` s
    off. The master prints at ``rate`` lines/s, so it still runs when the streams are cut (a master
    that has already exited leaves nothing to resume)."""
    double.call("/_double/knobs", {"clock_offset": offset, "drop_log_streams": [lines // (drops + 1), drops]})
    try:
        return tally(read(double, lines, rate), lines)  # type: ignore[operator]
    finally:
        double.call("/_double/knobs", {"clock_offset": 0.0, "drop_log_streams": [0, 0]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--drops", type=int, default=20)
    parser.add_argument("--drop-lines", type=int, default=60_000)
    args = parser.parse_args()
    double = Double()
    try:
        for name, read in (("airflow-mpi", ours), ("KubernetesPodOperator", kpo_stream)):
            started = time.perf_counter()
            print(name, tally(read(double, args.lines), args.lines), f"{time.perf_counter() - started:.1f} s")
            for offset in (0.0, 2.5, -2.5):
                cut = with_drops(double, read, args.drop_lines, args.drops, offset)
                print(f"  {args.drops} drops, clock {offset:+}", cut)
    finally:
        double.stop()


if __name__ == "__main__":
    logging.getLogger("airflow_mpi").setLevel(logging.WARNING)
    main()
