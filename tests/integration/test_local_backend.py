"""The local backend for real: sshd, Open MPI and Python ranks in namespaced pods.

Every test ends with the leak check of conftest (no namespace, link, sshd, orted or mpiexec left).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.exceptions import BackendUnavailable, JobFailed, JobTimeout, SshdNotReady
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.job.ssh import generate_keypair
from airflow_mpi.observe.readiness import HostProblem
from airflow_mpi.runner.job import JobResult, JobRunner
from airflow_mpi.runner.waits import wait_for_sshd
from airflow_mpi.spec import MPIJobSpec

PY = sys.executable


def make_plan(command: list[str], run_id: str = "r1", **fields: Any) -> JobPlan:
    data: dict[str, Any] = {"name": "itest", "command": command, "workers": {"replicas": 2}}
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), RunIdentity("itest", "train", f"{run_id}-{time.time_ns()}"))


class Log:
    """Collects log records with their arrival time, like the task log would."""

    def __init__(self, on_line: Callable[[str], None] | None = None) -> None:
        self.records: list[tuple[float, str]] = []
        self.on_line = on_line

    def __call__(self, text: str) -> None:
        now = time.time()
        self.records.append((now, text))
        if self.on_line:
            for line in text.splitlines():
                self.on_line(line)

    @property
    def lines(self) -> list[str]:
        return [line for _, text in self.records for line in text.splitlines()]

    def rank_lines(self, rank: int) -> list[str]:
        prefix = f"[1,{rank}]<stdout>:"
        return [line[len(prefix) :] for line in self.lines if line.startswith(prefix)]


def run(backend: LocalBackend, plan: JobPlan, log: Log | None = None) -> JobResult:
    return JobRunner(backend, plan, log if log is not None else Log()).run()


def test_hello_world_across_three_pods(backend: LocalBackend) -> None:
    plan = make_plan(["bash", "-c", 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $NODE_RANK $(hostname) $MASTER_ADDR"'])
    log = Log()
    result = run(backend, plan, log)
    assert result.exit_code == 0 and result.np == 3
    rows = sorted(line.split() for rank in range(3) for line in log.rank_lines(rank))
    pods = [p.name for p in plan.pods]
    assert rows == [
        ["0", "3", "0", "0", pods[0], plan.master.host],
        ["1", "3", "0", "1", pods[1], plan.master.host],
        ["2", "3", "0", "2", pods[2], plan.master.host],
    ]
    assert f"MPI_HOSTS={plan.master.host}:1,{plan.workers[0].host}:1,{plan.workers[1].host}:1" in log.lines
    assert set(result.timings) == {"submitted", "created", "sshd_ready", "mpiexec_started", "finished"}
    assert backend.leftovers(plan.job_name) == []


def test_torch_rendezvous_resolves_every_peer_without_warnings(backend: LocalBackend) -> None:
    """torch.distributed's TCPStore is dual-stack: it holds peers as IPv4-mapped IPv6 addresses
    and names them in its log lines. Each pod resolves those from its hosts file, so no rank warns
    "The hostname of the client socket cannot be retrieved" (a DNS lookup the pod cannot make)."""
    code = (
        "import os, socket, torch.distributed as dist\n"
        "ip = socket.getaddrinfo(os.environ['MASTER_ADDR'], 1, socket.AF_INET)[0][4][0]\n"
        "print('mapped', socket.getnameinfo(('::ffff:' + ip, 1, 0, 0), socket.NI_NUMERICSERV)[0], flush=True)\n"
        "dist.init_process_group('gloo')\n"
        "dist.barrier()\n"
        "print('rendezvous', dist.get_rank(), dist.get_world_size(), flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    plan = make_plan([PY, "-c", code], env={"OMP_NUM_THREADS": "1"})
    log = Log()
    result = run(backend, plan, log)
    assert result.exit_code == 0
    for rank in range(3):
        assert log.rank_lines(rank) == [f"mapped {plan.master.host}", f"rendezvous {rank} 3"]
    assert not [line for line in log.lines if "cannot be retrieved" in line or "Warning" in line], log.lines


def test_mpi4py_allreduce_and_result(backend: LocalBackend) -> None:
    code = (
        "from mpi4py import MPI; import json; c = MPI.COMM_WORLD; total = c.allreduce(c.rank + 1)\n"
        "print('AIRFLOW_MPI_RESULT ' + json.dumps({'sum': total, 'rank': c.rank, 'size': c.size}))"
    )
    plan = make_plan([PY, "-c", code], workers={"replicas": 2, "cpu": 2}, master={"cpu": 2})
    result = run(backend, plan)
    assert result.np == 6
    assert result.result == {"sum": 21, "rank": 0, "size": 6}


def test_hostfile_mode_and_rank_env_file(backend: LocalBackend, shared_dir: Path) -> None:
    (shared_dir / "rank.env").write_text("# comment\nGREETING=hello world\nBAD LINE\n")
    plan = make_plan(
        ["bash", "-c", 'echo "$GREETING from $NODE_RANK in $PWD"'],
        hosts_mode="hostfile",
        mpi={"env_file": str(shared_dir / "rank.env"), "wdir": str(shared_dir)},
        pod={"volumes": [{"name": "shared", "host_path": str(shared_dir), "mount_path": str(shared_dir)}]},
    )
    log = Log()
    run(backend, plan, log)
    assert sorted(line for r in range(3) for line in log.rank_lines(r)) == [
        f"hello world from {i} in {shared_dir}" for i in range(3)
    ]


def failing_job(backend: LocalBackend, code: str, marker: str = "about to fail") -> tuple[JobFailed, float]:
    """Run a job whose rank 1 fails; return the error and seconds from the failure to the task error."""
    failed_at: list[float] = []
    log = Log(on_line=lambda line: failed_at.append(time.monotonic()) if marker in line else None)
    plan = make_plan([PY, "-c", code])
    with pytest.raises(JobFailed) as caught:
        run(backend, plan, log)
    assert failed_at, f"the failing rank never printed {marker!r}: {log.lines[-20:]}"
    return caught.value, time.monotonic() - failed_at[0]


def test_rank_exit_3_fails_naming_rank_and_code(backend: LocalBackend) -> None:
    error, seconds = failing_job(
        backend,
        "import os, sys, time\nif os.environ['RANK'] == '1':\n    print('about to fail', flush=True); sys.exit(3)\ntime.sleep(60)",
    )
    assert seconds < 10
    assert (error.rank, error.exit_code) == (1, 3)
    assert "rank 1 on pod itest-" in str(error) and "worker-0 exited with code 3" in str(error)
    assert "about to fail" in error.tail


@pytest.mark.parametrize(
    ("case", "failure"),
    [("raise", "raise ValueError('bad batch')"), ("sys.exit(3)", "sys.exit(3)")],
)
def test_python_rank_that_imported_mpi4py_does_not_hang(backend: LocalBackend, case: str, failure: str) -> None:
    code = (
        "import os, sys, time\nfrom mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"
        f"if os.environ['RANK'] == '1':\n    print('about to fail', flush=True); {failure}\n"
        "MPI.COMM_WORLD.Barrier()\ntime.sleep(60)"
    )
    error, seconds = failing_job(backend, code)
    assert seconds < 10, f"{case}: the job took {seconds:.1f}s to end"
    assert error.rank == 1
    if case == "raise":
        assert any("ValueError: bad batch" in line for line in error.tail)
    else:
        assert error.exit_code == 3


def test_timeout_kills_the_job_within_5s_of_the_deadline(backend: LocalBackend) -> None:
    plan = make_plan(["sleep", "120"], timeout=3)
    log = Log()
    runner = JobRunner(backend, plan, log)
    started: list[float] = []
    original = backend.start_master

    def start_master(job_name: str) -> None:
        original(job_name)
        started.append(time.monotonic())

    backend.start_master = start_master  # type: ignore[method-assign]
    with pytest.raises(JobTimeout) as caught:
        runner.run()
    overshoot = time.monotonic() - started[0] - 3
    assert 0 <= overshoot < 5, overshoot
    assert "timeout of 3s" in str(caught.value)


def test_worker_killed_mid_run_ends_the_job(backend: LocalBackend) -> None:
    plan = make_plan([PY, "-c", "import os, time; print('running', os.environ['RANK'], flush=True); time.sleep(120)"])
    running: list[str] = []
    log = Log(on_line=lambda line: running.append(line) if "running" in line else None)
    runner = JobRunner(backend, plan, log)
    outcome: list[BaseException] = []
    thread = threading.Thread(target=lambda: _capture(runner.run, outcome))
    thread.start()
    _wait(lambda: len(running) == 3, 30, "ranks to start")
    victim = plan.workers[1].name
    pid = backend._sandbox(plan.job_name).procs[victim].pid
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive()
    assert time.monotonic() - killed_at < 10
    error = outcome[0]
    assert isinstance(error, JobFailed)
    assert error.pod == victim and victim in str(error)


def test_sshd_never_starting_fails_with_a_reason_per_host(backend: LocalBackend, shared_dir: Path) -> None:
    fake = shared_dir / "fake-sshd"
    fake.write_text("#!/bin/bash\nexec sleep 300\n")  # runs, never listens
    fake.chmod(0o755)
    plan = with_worker_env(make_plan(["true"], startup_timeout=3), AIRFLOW_MPI_SSHD=str(fake))
    started = time.monotonic()
    with pytest.raises(SshdNotReady) as caught:
        run(backend, plan)
    assert time.monotonic() - started < 3 + 5
    lines = str(caught.value).splitlines()
    assert lines[0] == f"MPI job {plan.job_name}: workers never accepted ssh: sshd is not running on a worker, " + (
        "or not on the job's ssh port (Connection refused); a bare mpiexec then prints nothing or hangs"
    )  # the cause first, then its fix and the line per host
    summary = lines.index("2 of 2 worker host(s) did not accept ssh within 3s:")
    for worker, line in zip(plan.workers, lines[summary + 1 :], strict=True):
        assert line.startswith(f"  {worker.host}: port closed: nothing listens on port 22")


def test_sshd_dying_at_start_fails_fast_with_its_output(backend: LocalBackend) -> None:
    plan = with_worker_env(make_plan(["true"], startup_timeout=60), AIRFLOW_MPI_SSHD="/bin/false")
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        run(backend, plan)
    assert time.monotonic() - started < 10
    assert "before sshd was ready" in str(caught.value) and "worker" in (caught.value.pod or "")


@pytest.mark.parametrize("fault", ["key refused", "host key mismatch"])
def test_probe_tells_key_refused_from_host_key_mismatch(backend: LocalBackend, fault: str) -> None:
    plan = make_plan(["true"], workers={"replicas": 1})
    try:
        backend.create(plan)
        wait_for_sshd(backend, plan.job_name, 30)
        ssh_dir = backend._sandbox(plan.job_name).dir / "pods" / plan.master.name / "ssh"
        if fault == "key refused":
            (ssh_dir / "id_ed25519").write_text(generate_keypair().private_openssh)
        else:
            host = plan.workers[0]
            wrong = generate_keypair().public_openssh.split()[:2]
            (ssh_dir / "known_hosts").write_text(f"{host.host},{host.name} {' '.join(wrong)}\n")
        [probe] = backend.probe_workers(plan.job_name)
        assert probe.problem is HostProblem(fault)
        assert ("authorized_keys" if fault == "key refused" else "pinned") in probe.describe()
    finally:
        backend.teardown(plan.job_name)


def test_on_kill_removes_everything(backend: LocalBackend) -> None:
    plan = make_plan([PY, "-c", "import time; print('running', flush=True); time.sleep(120)"])
    running: list[str] = []
    runner = JobRunner(backend, plan, Log(on_line=lambda line: running.append(line) if "running" in line else None))
    outcome: list[BaseException] = []
    thread = threading.Thread(target=lambda: _capture(runner.run, outcome))
    thread.start()
    _wait(lambda: len(running) == 3, 30, "ranks to start")
    killed_at = time.monotonic()
    assert runner.teardown() == []  # what MPIJobOperator.on_kill does
    thread.join(15)
    assert not thread.is_alive() and time.monotonic() - killed_at < 5
    assert backend.leftovers(plan.job_name) == []


def test_rank_output_reaches_the_log_live(backend: LocalBackend) -> None:
    code = (
        "import time\n"
        "for i in range(3):\n    print('tick', i, repr(time.time()))\n    time.sleep(1)\n"  # no flush=True on purpose
    )
    log = Log()
    plan = make_plan([PY, "-c", code], workers={"replicas": 0})
    run(backend, plan, log)
    ticks = [(at, text) for at, record in log.records for text in record.splitlines() if "tick" in text]
    end = log.records[-1][0]
    assert len(ticks) == 3
    first_at, first = ticks[0]
    printed_at = float(first.rsplit(" ", 1)[1])
    assert first_at - printed_at < 0.5, "a line took too long to reach the log"
    assert end - first_at > 1.5, "the first line arrived only when the job ended"


def test_two_jobs_at_once_do_not_collide(backend: LocalBackend) -> None:
    plans = [make_plan(["hostname"], run_id=f"backfill-{i}") for i in range(2)]
    results: list[Any] = [None, None]
    created = threading.Barrier(2, timeout=60)

    def go(i: int) -> None:
        def emit(text: str) -> None:
            if "sshd ready" in text:
                created.wait()  # both jobs exist at the same time

        results[i] = _result_or_error(lambda: JobRunner(backend, plans[i], emit).run())

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(isinstance(r, JobResult) for r in results), results
    assert plans[0].job_name != plans[1].job_name


def test_crashed_owner_is_swept_by_the_next_job(backend: LocalBackend, state_root: Path) -> None:
    script = (
        "import sys, time\n"
        "from airflow_mpi.backends.local import LocalBackend\n"
        "from airflow_mpi.job.plan import render_plan\n"
        "from airflow_mpi.job.naming import RunIdentity\n"
        "from airflow_mpi.spec import MPIJobSpec\n"
        "spec = MPIJobSpec.from_dict({'name': 'crash', 'command': ['true'], 'workers': {'replicas': 2}})\n"
        "plan = render_plan(spec, RunIdentity('d', 't', sys.argv[2]))\n"
        "LocalBackend(state_dir=sys.argv[1]).create(plan)\n"
        "print(plan.job_name, flush=True)\n"
        "time.sleep(300)\n"
    )
    owner = subprocess.Popen(
        [PY, "-c", script, str(state_root), f"crash-{time.time_ns()}"], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    job_name = owner.stdout.readline().strip()
    assert backend.leftovers(job_name), "the crashed job should exist before the sweep"
    owner.kill()  # SIGKILL: no finally, no on_kill; its pods may still be starting
    owner.wait()
    run(backend, make_plan(["true"], workers={"replicas": 0}))  # any next job sweeps
    assert backend.leftovers(job_name) == []  # records, namespaces, links, and every process in them


def test_mount_points_the_job_made_on_the_host_go_with_it(backend: LocalBackend, shared_dir: Path) -> None:
    mount = shared_dir / "made" / "data"
    volume = {"name": "scratch", "mount_path": str(mount), "empty_dir": True}
    plan = make_plan(["test", "-d", str(mount)], workers={"replicas": 1}, pod={"volumes": [volume]})
    assert run(backend, plan).exit_code == 0  # the pods had it
    assert not (shared_dir / "made").exists()  # the host keeps nothing it did not have
    assert shared_dir.is_dir()


# From a pod: connect to a TCP port at the pod network's first address (once the host's own
# address on the job's bridge) and at every address of the host's other interfaces.
HOST_PROBE = """
import socket, sys
port, addresses = int(sys.argv[1]), sys.argv[2:]
ip = socket.gethostbyname(socket.gethostname())
for host in [ip.rsplit(".", 1)[0] + ".1", *addresses]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("REACHED", host, flush=True)
    except OSError as error:
        print("REFUSED", host, type(error).__name__, flush=True)
"""


def test_pods_cannot_reach_a_host_service_through_their_bridge(backend: LocalBackend) -> None:
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()
    ipv4 = [a for a in addresses if "." in a and not a.startswith("10.244.")]
    with socket.create_server(("0.0.0.0", 0)) as server:  # a host service on every address
        port = server.getsockname()[1]
        log = Log()
        plan = make_plan([PY, "-c", HOST_PROBE, str(port), *ipv4], workers={"replicas": 0})
        assert run(backend, plan, log).exit_code == 0
    answers = [line for line in log.lines if "REACHED" in line or "REFUSED" in line]
    assert len(answers) == 1 + len(ipv4), log.lines
    assert not [line for line in answers if "REACHED" in line], answers


def test_cli_run_exits_with_the_jobs_code(state_root: Path, shared_dir: Path) -> None:
    spec = shared_dir / "job.yaml"
    spec.write_text(
        json.dumps({"name": "cli", "command": [PY, "-c", "import sys; sys.exit(7)"], "workers": {"replicas": 1}})
    )
    done = subprocess.run(
        [
            PY,
            "-m",
            "airflow_mpi.cli.main",
            "run",
            str(spec),
            "--run-id",
            f"cli-{time.time_ns()}",
            "--state-dir",
            str(state_root),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 7, done.stderr
    assert re.search(r"rank \d on pod cli-[a-z2-7]{13}-\S+ exited with code 7", done.stderr)


def test_two_cli_runs_of_one_spec_at_once_each_finish_whole(state_root: Path, shared_dir: Path) -> None:
    """Each ``airflow-mpi run`` is its own run: the second never replaces the first's job."""
    spec = shared_dir / "same.yaml"
    script = "import os, time; time.sleep(5); print('DONE', os.environ['MASTER_ADDR'].split('.')[-1], flush=True)"
    spec.write_text(json.dumps({"name": "same", "command": [PY, "-c", script], "workers": {"replicas": 1}}))
    command = [PY, "-m", "airflow_mpi.cli.main", "run", str(spec), "--state-dir", str(state_root)]
    # The second starts while the first's ranks sleep, so both jobs live at once.
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(2)
    second = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=90)
    first_out, _ = first.communicate(timeout=90)
    assert first.returncode == 0 and second.returncode == 0, (first_out, second.stdout)
    first_jobs = set(re.findall(r"DONE (same-[a-z2-7]{13})", first_out))
    second_jobs = set(re.findall(r"DONE (same-[a-z2-7]{13})", second.stdout))
    assert len(first_jobs) == 1 and len(second_jobs) == 1 and first_jobs != second_jobs, (first_out, second.stdout)
    # every rank of each job printed: both ran whole
    assert first_out.count("DONE") == 2 and second.stdout.count("DONE") == 2, (first_out, second.stdout)


def test_missing_tools_fail_before_anything_is_created(state_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    backend = LocalBackend(state_dir=state_root)
    plan = make_plan(["true"])
    with pytest.raises(BackendUnavailable) as caught:
        backend.create(plan)
    assert "'ip' (apt-get install iproute2)" in str(caught.value)
    assert "'mpiexec' (apt-get install openmpi-bin)" in str(caught.value)
    assert not (state_root / plan.job_name).exists()


def with_worker_env(plan: JobPlan, **env: str) -> JobPlan:
    """Fault injection: extra env for the workers only (the spec itself refuses AIRFLOW_MPI_*)."""
    pods = tuple(
        dataclasses.replace(pod, env={**pod.env, **env}) if pod.role.value == "worker" else pod for pod in plan.pods
    )
    return dataclasses.replace(plan, pods=pods)


def _capture(fn: Callable[[], Any], sink: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as error:
        sink.append(error)


def _result_or_error(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BaseException as error:
        return error


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
