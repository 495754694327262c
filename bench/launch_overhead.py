"""Launch overhead of the local backend (a script that prints figures, not a timed test).

overhead = wall of a 3-pod `hostname` job through the backend (create, sshd readiness, master
launch script, mpiexec, teardown)  -  wall of a bare `mpiexec -np 3 hostname` run inside the
same master pod, over the same namespaces, hosts and ssh configuration.

    sudo .venv/bin/python bench/launch_overhead.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

from _state import STATE_DIR, remove_state_dir

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.job.naming import RunIdentity, build_pod_name
from airflow_mpi.job.plan import render_plan
from airflow_mpi.job.topology import render_mpi_hosts
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec, Role

MPIS = Path.home() / ".cache/airflow-mpi/mpi"  # Makefile: MPI_VENVS (`make mpis`)
# Each MPI the bench measures: the job's mpi fields, and its bare launcher's command line.
IMPLEMENTATIONS: dict[str, dict[str, str]] = {
    "Open MPI 4.1.4": {"implementation": "openmpi", "mpiexec": "mpiexec"},
    "Open MPI 5.0.11": {"implementation": "openmpi", "mpiexec": str(MPIS / "openmpi-5.0.11/bin/mpiexec")},
    "MPICH 4.0.2": {"implementation": "mpich", "mpiexec": "/usr/bin/mpiexec.mpich"},
    "MPICH 5.0.2": {"implementation": "mpich", "mpiexec": str(MPIS / "mpich-5.0.2/bin/mpiexec")},
    "Intel MPI 2021.17": {"implementation": "intel", "mpiexec": str(MPIS / "impi-rt-2021.17.2/bin/mpiexec")},
}


def spec(command: list[str], workers: int = 2, mpi: dict[str, str] | None = None) -> MPIJobSpec:
    data = {"name": "bench", "command": command, "workers": {"replicas": workers}, "mpi": dict(mpi or {})}
    return MPIJobSpec.from_dict(data)


def bare_argv(mpi: dict[str, str], hosts: str, np: int, ssh_config: str) -> list[str]:
    """The launcher alone, with only what it needs to reach the pods: the job's ssh config and
    full host names, one rank a host."""
    launcher, implementation = mpi.get("mpiexec", "mpiexec"), mpi.get("implementation", "openmpi")
    if implementation == "mpich":
        return ["env", "HYDRA_LAUNCHER=ssh", f"HYDRA_LAUNCHER_EXTRA_ARGS=-F {ssh_config}",
                launcher, "-hosts", hosts, "-np", str(np), "hostname"]  # fmt: skip
    if implementation == "intel":
        names = ",".join(host.rsplit(":", 1)[0] for host in hosts.split(","))
        return ["env", "I_MPI_HYDRA_BOOTSTRAP=ssh", f"I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS=-F {ssh_config}",
                launcher, "-hosts", names, "-ppn", "1", "-np", str(np), "hostname"]  # fmt: skip
    version = subprocess.run([launcher, "--version"], capture_output=True, text=True, check=False).stdout
    prrte = "(Open MPI) 5." in version
    return [
        launcher, "--allow-run-as-root", "--host", hosts, "-np", str(np),
        "--mca", "prte_keep_fqdn_hostnames" if prrte else "orte_keep_fqdn_hostnames", "1",
        "--mca", "plm_ssh_args" if prrte else "plm_rsh_args", f"-F {ssh_config}",
        "hostname",
    ]  # fmt: skip


def through_backend(
    backend: LocalBackend, run: int, workers: int = 2, mpi: dict[str, str] | None = None
) -> tuple[float, dict[str, float]]:
    identity = RunIdentity("bench", "hello", f"run-{run}-{time.time_ns()}")
    plan = render_plan(spec(["hostname"], workers, mpi), identity)
    started = time.perf_counter()
    result = JobRunner(backend, plan, lambda _text: None).run()
    return time.perf_counter() - started, result.durations_s


def bare_mpiexec(backend: LocalBackend, runs: int, workers: int = 2, mpi: dict[str, str] | None = None) -> list[float]:
    """Keep a job's pods up (the master sleeps) and run the plain launcher inside the master pod."""
    np = workers + 1
    plan = render_plan(spec(["sleep", "600"], workers, mpi), RunIdentity("bench", "bare", f"bare-{time.time_ns()}"))
    hosts = render_mpi_hosts(plan.topology)
    runner = JobRunner(backend, plan, lambda _text: None)
    import threading

    thread = threading.Thread(target=lambda: _quietly(runner.run), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while runner.output.lines_seen < 3 or not _master_init(backend, plan.job_name):
            if time.monotonic() > deadline:
                raise RuntimeError("the bare-mpiexec job did not start")
            time.sleep(0.05)
        time.sleep(1.0)  # let the job's own mpiexec finish starting its ranks
        init = _master_init(backend, plan.job_name)
        argv = ["nsenter", "-t", str(init), "-a", *bare_argv(mpi or {}, hosts, np, plan.paths.ssh_config)]
        walls = []
        for _ in range(runs):
            started = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            walls.append(time.perf_counter() - started)
            if done.returncode != 0 or len(done.stdout.split()) != np:
                raise RuntimeError(f"bare mpiexec failed: {done.stdout} {done.stderr}")
        return walls
    finally:
        runner.teardown()
        thread.join(30)


def _master_init(backend: LocalBackend, job_name: str) -> int | None:
    sandbox = backend._sandbox(job_name)
    proc = sandbox.procs.get(build_pod_name(job_name, Role.MASTER, 0))
    if proc is None:
        return None
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return int(children[0]) if children else None


def _quietly(fn: object) -> None:
    try:
        fn()  # type: ignore[operator]
    except Exception:  # the bare job is torn down on purpose
        pass


PHASES = ("create", "sshd_ready", "mpiexec")


def measure(runs: int, workers: int = 2, mpi: dict[str, str] | None = None) -> dict[str, object]:
    """Medians of ``runs`` jobs through the backend and of ``runs`` bare launchers over the same
    pods (``mpi``: the job's mpi fields, Open MPI 4 by default)."""
    backend = LocalBackend(state_dir=STATE_DIR)
    through_backend(backend, -1, workers, mpi)  # warm caches (Python imports in ranks, ssh binaries)
    job_walls, phases = [], []
    for run in range(runs):
        wall, durations = through_backend(backend, run, workers, mpi)
        job_walls.append(wall)
        phases.append(durations)
    bare = bare_mpiexec(backend, runs, workers, mpi)
    return {
        "job": statistics.median(job_walls),
        "job_range": (min(job_walls), max(job_walls)),
        "bare": statistics.median(bare),
        "bare_range": (min(bare), max(bare)),
        "phases": {phase: statistics.median(p[phase] for p in phases) for phase in PHASES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    figures = measure(args.runs)
    job_median, bare_median = figures["job"], figures["bare"]
    print(f"runs: {args.runs} (median; min-max)")
    print(f"3-pod hello job through the backend: {job_median:.3f} s {figures['job_range']}")
    for phase, value in figures["phases"].items():  # type: ignore[attr-defined]
        print(f"  {phase:<11} {value:.3f} s")
    print(f"bare mpiexec -np 3 in the same pods: {bare_median:.3f} s {figures['bare_range']}")
    print(f"launch overhead: {job_median - bare_median:.3f} s (target <= 0.3 s)")  # type: ignore[operator]


if __name__ == "__main__":
    try:
        main()
    finally:
        remove_state_dir()
