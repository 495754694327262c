"""Every benchmark in one command, each figure next to the baseline it is judged against, both
measured in the same run (absolute times on shared machines drift; ratios much less).

    .venv/bin/python bench/run.py [--quick] [--only NAME ...] [--page docs/figures.md]

Writes bench/results.json (``{"meta": ..., "figures": [...]}``, one object per figure) and prints
a Markdown table. Exits 1 only when a benchmark broke (raised, or measured nothing): a missed
target is a figure to read, not a failure, since these machines are noisy.

The local-backend benchmarks (network namespaces, sshd, mpiexec) share machine-wide state with
the integration tests, so they run under the same lock (``/tmp/airflow-mpi-itest.lock``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import logging
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from report import Figure, figure, markdown_table, rewrite_page

HERE = Path(__file__).resolve().parent
LOCK = "/tmp/airflow-mpi-itest.lock"


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """The integration tests' lock: one user of namespaces, sshd and mpiexec at a time."""
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- the benchmarks: each returns its figures ------------------------------------------------


# A job's whole cost over its launcher alone (3 pods: create, sshd readiness, teardown).
LAUNCH_OVERHEAD_TARGET_S = 0.3


def launch(quick: bool) -> list[Figure]:
    """1. A 3-pod hello job through the runner minus bare mpiexec -np 3 over the same pods."""
    from launch_overhead import measure

    got = measure(runs=3 if quick else 7)
    job, bare = float(got["job"]), float(got["bare"])  # type: ignore[arg-type]
    phases: dict[str, float] = got["phases"]  # type: ignore[assignment]
    figures = [
        figure(
            "launch: 3-pod hello job, wall",
            job,
            "s",
            baseline="bare `mpiexec -np 3` in the same pods",
            baseline_value=bare,
        ),
        figure("launch overhead (job - bare mpiexec)", job - bare, "s", at_most=LAUNCH_OVERHEAD_TARGET_S),
    ]
    figures += [figure(f"launch phase: {name}", value, "s") for name, value in phases.items()]
    return figures


def implementations(quick: bool) -> list[Figure]:
    """1b. The 3-pod hello job on each MPI installed (`make mpis`) against its bare launcher."""
    from launch_overhead import IMPLEMENTATIONS, measure

    figures = []
    for name, mpi in IMPLEMENTATIONS.items():
        if shutil.which(mpi["mpiexec"]) is None:
            continue
        got = measure(runs=2 if quick else 5, mpi=mpi)
        job, bare = float(got["job"]), float(got["bare"])  # type: ignore[arg-type]
        wall = f"launch on {name}: 3-pod hello job, wall"
        figures.append(figure(wall, job, "s", baseline=f"bare {name} launcher", baseline_value=bare))
        overhead = f"launch overhead on {name} (job - bare launcher)"
        figures.append(figure(overhead, job - bare, "s", at_most=LAUNCH_OVERHEAD_TARGET_S))
    return figures


def scaling(quick: bool) -> list[Figure]:
    """2. 1, 2, 4, 8 workers (1 rank each, plus the master's): wall against bare mpiexec."""
    from launch_overhead import measure

    sizes = (1, 4) if quick else (1, 2, 4, 8)
    runs = 2 if quick else 3
    figures, walls, bares = [], {}, {}
    for workers in sizes:
        got = measure(runs=runs, workers=workers)
        walls[workers], bares[workers] = float(got["job"]), float(got["bare"])  # type: ignore[arg-type]
        figures.append(
            figure(
                f"scaling: {workers} worker(s), job wall",
                walls[workers],
                "s",
                baseline=f"bare `mpiexec -np {workers + 1}` in the same pods",
                baseline_value=bares[workers],
            )
        )
    first, last = sizes[0], sizes[-1]
    figures.append(
        figure(
            "scaling: wall growth per added worker",
            (walls[last] - walls[first]) / (last - first),
            "s",
            baseline="bare mpiexec's growth per added rank",
            baseline_value=(bares[last] - bares[first]) / (last - first),
            ratio_at_most=1.0,  # each added worker costs no more than the launcher's own work for it
        )
    )
    return figures


def local_logs(quick: bool) -> list[Figure]:
    """4b. Local backend log flood into a task logger against the same lines written to /dev/null."""
    from log_throughput import flood, to_devnull, trickle

    lines = 30_000 if quick else 100_000
    log_path = Path("/var/tmp/airflow-mpi-bench-task.log")
    try:
        got = flood(lines, log_path)
    finally:
        log_path.unlink(missing_ok=True)
    devnull = to_devnull(lines)
    delays = trickle(2.0 if quick else 5.0)
    return [
        figure(
            "local logs: flood into the task logger",
            got["lines_per_s"],
            "lines/s",
            baseline="the same 3 processes writing to /dev/null",
            baseline_value=devnull,
        ),
        figure(
            "local logs: print -> log record p99 at 20 lines/s", delays[int(len(delays) * 0.99) - 1], "s", at_most=0.1
        ),
    ]


def training(quick: bool) -> list[Figure]:
    """5. The example's DeepSpeed training: steps per second under the operator / bare mpiexec."""
    from training import measure

    got = measure(epochs=8 if quick else 40, runs=1 if quick else 3)
    return [
        figure(
            "training: DeepSpeed steps/s, 3 pods x 1 rank (the example)",
            got["operator_steps_per_s"],
            "steps/s",
            baseline="the same script under bare `mpiexec -np 3`, same pods and hosts",
            baseline_value=got["bare_steps_per_s"],
            ratio_at_least=0.97,
        ),
        figure(
            "training: seconds of the training loop",
            got["operator_train_s"],
            "s",
            baseline="bare mpiexec, same loop",
            baseline_value=got["bare_train_s"],
        ),
    ]


def control_plane(quick: bool) -> list[Figure]:
    """3. The Kubernetes backend against the API double (its own process), N = 1 .. 1000 workers."""
    import resource

    from k8s_double import Double, bare_api, scale

    sizes = (1, 10, 100) if quick else (1, 10, 100, 1000)
    figures = []
    double = Double()
    try:
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ours = {n: scale(double, n) for n in sizes}
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the bare client's own use
        for n in sizes:
            got, bare = ours[n], bare_api(double, n)
            figures += [
                figure(
                    f"control plane N={n}: API requests per job",
                    got["requests"],
                    "requests",
                    baseline="a bare client: POST each object, poll until Ready, DELETE each",
                    baseline_value=bare["requests"],
                    at_most=n + 10,
                ),
                figure(
                    f"control plane N={n}: submit -> all workers Ready",
                    got["submit_to_ready"],
                    "s",
                    baseline="the bare client, same manifests",
                    baseline_value=bare["submit_to_ready"],
                ),
                figure(f"control plane N={n}: last Ready -> master created", got["ready_to_master"], "s", at_most=0.2),
                figure(
                    f"control plane N={n}: teardown",
                    got["teardown"],
                    "s",
                    baseline="the bare client's DELETEs (not waiting for the pods to go)",
                    baseline_value=bare["teardown"],
                ),
            ]
    finally:
        double.stop()
    figures.append(
        figure(
            f"control plane: operator process peak RSS (through N={sizes[-1]})",
            rss,
            "MB",
            baseline="the same process before any job (imports)",
            baseline_value=rss_before,
            at_most=300,
        )
    )
    return figures


def kubernetes_logs(quick: bool) -> list[Figure]:
    """4. The master's log through this project's path and KubernetesPodOperator's, same double."""
    from k8s_double import Double
    from kpo_logs import kpo_stream, ours, tally, with_drops

    lines = 50_000 if quick else 200_000
    drops, drop_lines = (3, 7_500) if quick else (20, 60_000)
    figures = []
    double = Double()
    try:
        mine, theirs = tally(ours(double, lines), lines), tally(kpo_stream(double, lines), lines)
        figures.append(
            figure(
                f"k8s logs: {lines:,} lines into the task logger",
                mine.lines_per_s,
                "lines/s",
                baseline="KubernetesPodOperator (PodManager.fetch_container_logs, follow=True)",
                baseline_value=theirs.lines_per_s,
                ratio_at_least=10,
            )
        )
        for name, got in (("airflow-mpi", mine), ("KubernetesPodOperator", theirs)):
            figures.append(figure(f"k8s logs, {name}: lines lost + duplicated", got.lost + got.duplicated, "lines"))
        for offset in (0.0, 2.5, -2.5):
            mine = with_drops(double, ours, drop_lines, drops, offset)
            theirs = with_drops(double, kpo_stream, drop_lines, drops, offset)
            where = f"{drops} dropped streams, node clock {offset:+.1f} s"
            for what, value, other in (
                ("duplicated", mine.duplicated, theirs.duplicated),
                ("lost", mine.lost, theirs.lost),
            ):
                figures.append(
                    figure(
                        f"k8s logs, {where}: {what}",
                        value,
                        "lines",
                        baseline="KubernetesPodOperator, same drops",
                        baseline_value=other,
                        at_most=0,
                    )
                )
    finally:
        double.stop()
    return figures


def deferred_jobs(quick: bool) -> list[Figure]:
    """6. 100 deferred jobs (20 in the quick run) waiting in one triggerer process."""
    from deferred import measure
    from k8s_double import Double

    jobs = 20 if quick else 100
    double = Double()
    try:
        got = measure(double, jobs, quiet=2.0 if quick else 5.0)
    finally:
        double.stop()
    poll_interval = 2.0  # KubernetesPodTrigger's default: one read of the pod per poll
    return [
        figure(
            f"deferred: triggerer RSS with {jobs} jobs waiting",
            got["rss_peak_mb"],
            "MB",
            baseline="the same process before any trigger (Airflow, the trigger, its async client imported)",
            baseline_value=got["rss_before_mb"],
            at_most=200,
        ),
        figure(
            "deferred: API requests per job while waiting",
            got["requests_per_job_waiting"],
            "requests",
            baseline=f"KubernetesPodTrigger polling every {poll_interval:.0f} s over the same wait (computed)",
            baseline_value=got["waited_s"] / poll_interval,
        ),
        figure("deferred: API requests of all jobs in a quiet window", got["requests_in_quiet_window"], "requests"),
        figure(f"deferred: triggerer start -> all {jobs} triggers watching", got["all_watching_s"], "s"),
        figure("deferred: master exit -> trigger event p50", got["delay_p50_s"], "s"),
        figure("deferred: master exit -> trigger event p99", got["delay_p99_s"], "s"),
    ]


def deferred_logs(quick: bool) -> list[Figure]:
    """7. 100 deferred jobs (10 in the quick run) whose master logs the triggers follow live,
    each printing 20 lines/s, plus one job flooding its log, in one triggerer process: once with
    the API double on the same CPUs, once with the double on one CPU and the triggerer on another
    (the API server is not on a triggerer's machine in a deployment)."""
    from deferred_logs import measure, waiting_process_rss
    from k8s_double import Double

    jobs, seconds = (10, 8.0) if quick else (100, 20.0)
    separate = len(os.sched_getaffinity(0)) >= 2
    double = Double()
    try:
        got = measure(double, jobs, 20.0, seconds, flood=True)
        apart = measure(double, jobs, 20.0, seconds, flood=True, separate_cpus=True) if separate else None
        waiting = waiting_process_rss(double, 20.0)
    finally:
        double.stop()
    for run in (got, apart):
        if run is not None and (run["errors"] or run["steady_jobs_seen"] < jobs):
            raise RuntimeError(f"triggers broke or showed nothing: {run}")
    threshold = got["airflow_warning_threshold_s"]
    figures = [
        figure(
            f"deferred logs: {jobs} jobs x 20 lines/s + 1 flood, line -> task log delay (max)",
            got["delay_max_s"],
            "s",
            at_most=2.0,
        ),
        figure("deferred logs: line -> log delay while the triggers start (max)", got["delay_starting_max_s"], "s"),
        figure("deferred logs: lines out of order, twice or missing", got["disorder"], "lines", at_most=0),
        figure(
            f"deferred logs: triggerer RSS, {jobs} jobs followed",
            got["rss_peak_mb"],
            "MB",
            baseline=f"the same jobs in waiting mode: {jobs} worker processes of {waiting:.0f} MB each",
            baseline_value=waiting * jobs,
            at_most=300,
        ),
        figure("deferred logs: event loop's longest block (steady)", got["loop_block_max_s"], "s", at_most=0.1),
        figure("deferred logs: of it, CPU the loop's thread used", got["loop_block_cpu_s"], "s", at_most=0.1),
        figure("deferred logs: event loop's longest block while the triggers start", got["loop_block_starting_s"], "s"),
        figure(
            f"deferred logs: Airflow's triggerer warnings 'async thread was blocked' (> {threshold:g} s), steady",
            got["airflow_warnings_steady"],
            "warnings",
            at_most=0,
        ),
        figure(
            f"deferred logs: flood job's lines shown in {seconds:.0f} s (the rest wait in the pod's log)",
            got["flood_lines"],
            "lines",
        ),
        figure("deferred logs: flood job's lag (its lines wait, none dropped)", got["flood_lag_max_s"], "s"),
    ]
    if apart is not None:
        figures += [
            figure(
                "deferred logs, the API double on another CPU: line -> task log delay (max)",
                apart["delay_max_s"],
                "s",
                at_most=2.0,
            ),
            figure(
                "deferred logs, the API double on another CPU: event loop's longest block (steady)",
                apart["loop_block_max_s"],
                "s",
                baseline="the same jobs, CPUs shared with the double (above)",
                baseline_value=got["loop_block_max_s"],
                at_most=0.1,
            ),
            figure(
                "deferred logs, the API double on another CPU: Airflow's triggerer warnings, steady",
                apart["airflow_warnings_steady"],
                "warnings",
                at_most=0,
            ),
            figure(
                "deferred logs, the API double on another CPU: lines out of order, twice or missing",
                apart["disorder"],
                "lines",
                at_most=0,
            ),
        ]
    return figures


def real_triggerer_logs(quick: bool) -> list[Figure]:
    """8. The same through Airflow's own triggerer: 100 deferrable tasks (and a flood) run by
    Airflow's real processes; the delays and order read from the trigger log files Airflow wrote,
    the triggerer's own "async thread was blocked" warnings, its RSS (supervisor + runner), where
    the machine's CPUs went. Twice: every process on the same CPUs, and the triggerer on a CPU of
    its own (as a deployment runs it: its own pod, the API server elsewhere)."""
    from deferred_logs import waiting_process_rss
    from k8s_double import Double
    from real_triggerer_logs import measure

    jobs, seconds = (10, 8.0) if quick else (100, 20.0)
    runs = {"": measure(jobs, 20.0, seconds, loop_stats=True)}
    if not quick and len(os.sched_getaffinity(0)) >= 2:
        runs[", the triggerer on a CPU of its own"] = measure(jobs, 20.0, seconds, loop_stats=True, triggerer_cpu=True)
    double = Double()
    try:
        waiting = waiting_process_rss(double, 20.0)
    finally:
        double.stop()
    figures: list[Figure] = []
    for layout, got in runs.items():
        if got["steady_jobs_seen"] < jobs - len(got["failed_before_following"]) or got["steady_lines_min"] == 0:
            raise RuntimeError(f"the triggerer showed nothing for some tasks: {got}")
        figures += real_triggerer_figures(f"Airflow's triggerer, {jobs} deferred tasks x 20 lines/s + 1 flood{layout}",
                                          got, jobs, waiting)  # fmt: skip
    return figures


def real_triggerer_figures(prefix: str, got: dict[str, Any], jobs: int, waiting_mb: float) -> list[Figure]:
    figures = [
        figure(
            f"{prefix}: line -> in the trigger log file (max; the file polled every 0.1 s)",
            got["delay_to_file_max_s"],
            "s",
            at_most=2.0,
        ),
        figure(f"{prefix}: line -> its record's time (max; taken as the runner writes it)", got["delay_max_s"], "s"),
        figure(f"{prefix}: line -> log delay while the streams start (max)", got["delay_starting_max_s"], "s"),
        figure(f"{prefix}: lines out of order, twice or missing", got["disorder"], "lines", at_most=0),
        figure(
            f"{prefix}: its 'async thread was blocked' warnings, steady",
            len(got["blocked_warnings_steady"]),
            "warnings",
            at_most=0,
        ),
        figure(
            f"{prefix}: triggerer RSS (supervisor + trigger runner)",
            got["rss_peak_mb"],
            "MB",
            baseline=f"the same tasks in waiting mode: {jobs} worker processes of {waiting_mb:.0f} MB each",
            baseline_value=waiting_mb * jobs,
        ),
        figure(
            f"{prefix}: triggerer RSS growth over its idle start ({got['rss_idle_mb']:.0f} MB, no trigger)",
            got["rss_peak_mb"] - got["rss_idle_mb"],
            "MB",
            at_most=300,
        ),
        figure(
            f"{prefix}: tasks Airflow failed before they followed (apache/airflow#72716)",
            len(got["failed_before_following"]),
            "tasks",
        ),
        figure(f"{prefix}: submit -> every task deferred", got["all_deferred_s"], "s"),
        figure(f"{prefix}: flood job's lines shown in {got['released_s']:.0f} s", got["flood_lines"], "lines"),
    ]
    cpus = got["cpu_use_steady"]  # CPUs busy over the steady window, by process
    steps = got["loop_long_steps"]  # the event loop's steps over 0.1 s, steady: where their time went
    airflow_cpus = cpus["scheduler_cpus"] + cpus["api-server_cpus"] + cpus["dag-processor_cpus"]
    where: list[tuple[str, float, str]] = [  # (what, value, unit)
        (f"CPUs busy, steady (of {os.cpu_count()})", cpus["machine_busy_cpus"], "CPUs"),
        ("of them, the trigger runner (the triggers)", cpus["trigger_runner_cpus"], "CPUs"),
        (
            "of them, the triggerer's supervisor (Airflow's trigger table, the log files)",
            cpus["triggerer_supervisor_cpus"],
            "CPUs",
        ),
        ("of them, the API double (every master's log)", cpus["api_double_cpus"], "CPUs"),
        ("of them, Airflow's scheduler, api-server and dag-processor", airflow_cpus, "CPUs"),
        ("event loop steps over 0.1 s, steady", steps["steps"], "steps"),
        ("of those steps' time, on a CPU (the triggers' own work)", steps["on_cpu_s"], "s"),
        ("of those steps' time, waiting for a CPU (the machine's other processes)", steps["waiting_for_cpu_s"], "s"),
        ("of those steps' time, blocked in a system call", steps["blocked_s"], "s"),
        ("the warnings' lag, in all", steps["warned_lag_s"], "s"),
        ("of that lag, the loop on a CPU", steps["warned_ticks"]["cpu"], "s"),
        ("of that lag, the loop waiting for a CPU", steps["warned_ticks"]["runqueue"], "s"),
    ]
    figures += [figure(f"{prefix}: {what}", value, unit) for what, value, unit in where]
    return figures


# name -> (function, needs the machine lock, in the quick run)
def real_cluster(quick: bool) -> list[Figure]:
    """9. The real control plane built from source: start, pod start latency, the pods, MPIJob and
    Volcano backends side by side (submit -> every rank started, API requests per job), and the
    master's log through the real log proxy against KubernetesPodOperator's reader."""
    from real_cluster import measure

    got = measure(quick)
    figures = [
        figure("real cluster: control plane start (etcd, apiserver, controller-manager, scheduler)",
               got["control_plane_start"], "s"),
        figure("real cluster: + 3 Nodes Ready (node agent)", got["nodes_ready"], "s"),
        figure("real cluster: mpi-operator start (CRD, RBAC, leading)", got["mpi_operator_start"], "s"),
        figure("real cluster: pod create -> ran (scheduler + node agent), median", got["pod_start_latency"], "s"),
    ]  # fmt: skip
    figures.append(figure("real cluster: Volcano start (webhooks answering, default queue open)",
                          got["volcano_start"], "s"))  # fmt: skip
    for workers in (2,) if quick else (2, 8):
        pods = got[f"pods_{workers}"]
        for kind, name in (("mpijob", "MPIJob backend (real mpi-operator)"),
                           ("volcano", "Volcano Job backend (real Volcano)"),
                           ("trainjob", "TrainJob backend (real Trainer and JobSet)")):  # fmt: skip
            other = got[f"{kind}_{workers}"]
            figures += [
                figure(f"real cluster {workers} workers: pods backend, submit -> every rank started",
                       pods["ranks_started"], "s", baseline=name, baseline_value=other["ranks_started"]),
                figure(f"real cluster {workers} workers: pods backend, API requests per job", pods["requests"],
                       "requests", baseline=name, baseline_value=other["requests"]),
            ]  # fmt: skip
    ours, kpo = got["logs"]["airflow-mpi"], got["logs"]["KubernetesPodOperator"]
    kpo_name = "KubernetesPodOperator (PodManager.fetch_container_logs, follow=True), same apiserver"
    figures.append(figure("real cluster logs: master's lines into the task logger (apiserver log proxy)",
                          ours["plain"]["lines_per_s"], "lines/s", baseline=kpo_name,
                          baseline_value=kpo["plain"]["lines_per_s"]))  # fmt: skip
    for what in ("lost", "duplicated"):
        figures.append(figure(f"real cluster logs, apiserver restarted mid-stream: lines {what}",
                              ours["apiserver_restart"][what], "lines", baseline=kpo_name,
                              baseline_value=kpo["apiserver_restart"][what], at_most=0))  # fmt: skip
    return figures


def real_nodes(quick: bool) -> list[Figure]:
    """10. Real Nodes (kubelet, containerd, runc, CNI, kube-proxy, CoreDNS) against the node agent,
    with the training image built from docker/Dockerfile: build, start, pod start, submit -> every
    rank started per backend, and the master's log from a real kubelet."""
    from real_nodes import WORKERS, measure

    got = measure(quick)
    built, agent = got["image"], "node agent (tests/cluster/node_agent.py)"
    figures = [
        figure("image: build cold (Debian base by mmdebstrap + Dockerfile by buildah)", built["cold"], "s"),
        figure("image: build warm (inputs unchanged: the cache)", built["warm"], "s"),
        figure("image: training image size (docker-archive, CUDA torch from PyPI)", built["size_mib"], "MiB"),
        figure("real Nodes: images imported into the Nodes' store (once per image set)", got["store_import"], "s"),
        figure("real Nodes: cluster up with 3 real Nodes Ready (store warm)", got["nodes_up"], "s",
               baseline=agent, baseline_value=got["agent_up"]),
        figure("real Nodes: bare pod create -> ran, median", got["nodes_pod_start"], "s",
               baseline=agent, baseline_value=got["agent_pod_start"]),
    ]  # fmt: skip
    for workers in WORKERS[:1] if quick else WORKERS:
        pods = got[f"pods_{workers}"]
        for kind, name in (("mpijob", "MPIJob backend (real mpi-operator)"),
                           ("volcano", "Volcano Job backend (real Volcano)"),
                           ("trainjob", "TrainJob backend (real Trainer and JobSet)")):  # fmt: skip
            figures.append(figure(f"real Nodes {workers} workers: pods backend, submit -> every rank started",
                                  pods["ranks_started"], "s", baseline=name,
                                  baseline_value=got[f"{kind}_{workers}"]["ranks_started"]))  # fmt: skip
    ours, kpo = got["logs"]["airflow-mpi"], got["logs"]["KubernetesPodOperator"]
    figures += [
        figure("real Nodes logs: master's lines into the task logger (real kubelet, apiserver log proxy)",
               ours["plain"]["lines_per_s"], "lines/s", baseline="KubernetesPodOperator's reader, same pod",
               baseline_value=kpo["plain"]["lines_per_s"]),
        figure("real Nodes logs: the container's log file parsed directly (the limit)", got["logs_direct"],
               "lines/s"),
        figure("real Nodes training: the example's steps/s (rank 0, 3 ranks on 3 Nodes) through the runner",
               got["training"]["operator_steps_per_s"], "steps/s",
               baseline="bare mpiexec in the same containers", baseline_value=got["training"]["bare_steps_per_s"]),
    ]  # fmt: skip
    return figures


def airflow_in_cluster(quick: bool) -> list[Figure]:
    """11. Airflow deployed in the real cluster (`make airflow-up`): up cold and warm, its images,
    its memory, and the example DAG's wall time there against dag.test() on this machine, both
    against the same cluster, image, claim and epochs."""
    from airflow_in_cluster import measure

    got = measure(quick)
    inside, host = got["in_cluster"], got["host"]
    figures = [
        figure("Airflow in the cluster: deployed, cold (its 2 images imported into 3 Nodes)", got["up_cold"], "s"),
        figure("Airflow in the cluster: of which the images' import", got["image_import"], "s"),
        figure("Airflow in the cluster: the Airflow image (docker-archive)", got["image_mib"]["airflow"], "MiB"),
        figure("Airflow in the cluster: the PostgreSQL image (docker-archive)", got["image_mib"]["postgres"], "MiB"),
        figure("Airflow in the cluster: memory of every component, idle working set", got["memory_mib"], "MiB"),
        figure(f"Airflow in the cluster: the example DAG's run, {got['epochs']} epochs (KubernetesExecutor)",
               inside["seconds"], "s", baseline="dag.test() on this machine, same cluster, image and epochs",
               baseline_value=host["seconds"]),
        figure("Airflow in the cluster: the example's train task", inside["tasks"]["train"], "s"),
        figure("Airflow in the cluster: the example's first run on fresh Nodes (the image unpacked there)",
               got["in_cluster_first"]["seconds"], "s"),
    ]  # fmt: skip
    if "up_warm" in got:
        warm = "Airflow in the cluster: deployed again, warm (images in the Nodes)"
        figures.insert(1, figure(warm, got["up_warm"], "s"))
        figures.insert(2, figure("Airflow in the cluster: removed (both namespaces, volumes)", got["down"], "s"))
    return figures


BENCHMARKS: dict[str, tuple[Callable[[bool], list[Figure]], bool, bool]] = {
    "launch": (launch, True, True),
    "implementations": (implementations, True, False),
    "scaling": (scaling, True, True),
    "local_logs": (local_logs, True, True),
    "training": (training, True, True),
    "control_plane": (control_plane, False, True),
    "kubernetes_logs": (kubernetes_logs, False, True),
    "deferred": (deferred_jobs, False, True),
    "deferred_logs": (deferred_logs, False, True),
    "real_triggerer_logs": (real_triggerer_logs, False, False),
    "real_cluster": (real_cluster, True, False),
    "real_nodes": (real_nodes, True, False),
    "airflow_in_cluster": (airflow_in_cluster, True, False),
}


def run_one(name: str, quick: bool) -> tuple[list[Figure], str | None]:
    """Its figures, or the error that broke it (a broken benchmark, not a missed target)."""
    function = BENCHMARKS[name][0]
    started = time.perf_counter()
    try:
        figures = function(quick)
        if not figures or all(f.value is None for f in figures):
            raise RuntimeError("measured nothing")
    except Exception as error:
        traceback.print_exc()
        return [], f"{name}: {type(error).__name__}: {error}"
    print(f"# {name}: {len(figures)} figures in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return figures, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the CI run: smaller sizes, under 2 minutes")
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHMARKS), help="these benchmarks only")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    parser.add_argument("--page", help="rewrite this page's figures section from the results (docs/figures.md)")
    args = parser.parse_args()
    logging.getLogger("airflow_mpi").setLevel(logging.WARNING)
    names = args.only or [name for name, (_, _, in_quick) in BENCHMARKS.items() if in_quick or not args.quick]
    started, load = time.time(), os.getloadavg()
    figures: list[Figure] = []
    broken: list[str] = []
    locked = [name for name in names if BENCHMARKS[name][1]]
    for group, lock in ((locked, machine_lock), ([n for n in names if n not in locked], contextlib.nullcontext)):
        if not group:
            continue
        with lock():  # taken once for every local-backend benchmark: others wait on it
            for name in group:
                got, error = run_one(name, args.quick)
                figures += got
                if error:
                    broken.append(error)
    results = {
        "meta": {
            "mode": "bench-quick" if args.quick else "bench",
            "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in load],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(time.time() - started, 1),
            "benchmarks": names,
            "broken": broken,
        },
        "figures": [f.to_json() for f in figures],
    }
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(markdown_table(results["figures"]))
    meta = results["meta"]
    print(f"\nload average {meta['load_average']} at the start, {meta['load_average_end']} at the end")
    if args.page and not broken:  # the page's table shows a complete run only
        page = Path(args.page)
        page.write_text(rewrite_page(page.read_text(), results))
    for error in broken:
        print(f"BROKEN: {error}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
