"""`airflow-mpi jobs | logs | delete | gc | run --backend kubernetes` against the API double over
real HTTP: what each prints, what each leaves, Ctrl-C cleanup, and clear errors without tracebacks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.cli.main import main
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, install_connections, job_objects, sigint_as_from_a_terminal
from tests.k8s.test_kubernetes_backend import make_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kubeconfig(tmp_path: Path, double: KubeDouble) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(double.kubeconfig()))
    return str(path)


@pytest.fixture
def cli(kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    def run(*args: str) -> tuple[int, str, str]:
        code = main([*args, "--kubeconfig", kubeconfig])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def leave_job(
    backend: KubernetesBackend, scripts: Scripts, task: str, master: PodScript | None = None, *, start: bool = True
) -> JobPlan:
    """A job as a dead Airflow worker leaves it: created, its master (playing ``master``) started,
    or not there (``start`` False: the worker died while creating the pods), nobody watching."""
    plan = make_plan(workers=2, name=task, identity=RunIdentity("etl", task, "scheduled__2026-11-30", try_number=2))
    if master is not None:
        scripts.on(plan.master.name, master)
    backend.create(plan)
    deadline = time.monotonic() + 10  # the workers up, as a worker that died waiting for them left them
    while not all(p.ok for p in backend.probe_workers(plan.job_name)) and time.monotonic() < deadline:
        backend.wait_for_change(plan.job_name, 0.2)
    if not start:  # the master is created with the workers: take it away again
        backend.objects.delete("default", "pods", plan.master.name)
        deadline = time.monotonic() + 10
        while backend.objects.get("default", "pods", plan.master.name) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    if start:
        backend.start_master(plan.job_name)
    backend.release(plan.job_name)
    return plan


def wait_for_phase(double: KubeDouble, pod: str, phase: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        obj = double.get("pods", "default", pod)
        if obj is not None and obj.get("status", {}).get("phase") == phase:
            return
        time.sleep(0.05)
    raise AssertionError(f"pod {pod} never reached {phase}")


def age(double: KubeDouble, job: str, hours: float) -> None:
    """Make the job look ``hours`` old (its Secret's and ConfigMap's creation time is its age,
    whatever the backend)."""
    stamp = (datetime.now(timezone.utc) - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for plural in ("secrets", "configmaps"):
        for obj in double.list_objects(plural, "default"):
            if (obj["metadata"].get("labels") or {}).get("airflow-mpi.io/job") == job:
                name = obj["metadata"]["name"]
                double.update_object(
                    plural, "default", name, lambda o: o["metadata"].__setitem__("creationTimestamp", stamp)
                )


@pytest.fixture
def cleanup(double: KubeDouble, backend: KubernetesBackend) -> Iterator[list[JobPlan]]:
    plans: list[JobPlan] = []
    yield plans
    for plan in plans:
        backend.teardown(plan.job_name)
    deadline = time.monotonic() + 10
    while job_objects(double) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_objects(double) == []


def test_jobs_prints_a_table_of_identity_phase_age_and_pods_ready(
    cli: Callable[..., tuple[int, str, str]],
    backend: KubernetesBackend,
    double: KubeDouble,
    scripts: Scripts,
    cleanup: list[JobPlan],
) -> None:
    done, busy, waiting = (
        leave_job(backend, scripts, "done", PodScript(lines=lambda: iter(["[1,0]<stdout>:ok"]), exit_code=0)),
        leave_job(backend, scripts, "busy", PodScript(lines=lambda: iter(["[1,0]<stdout>:epoch 1"]))),
        leave_job(backend, scripts, "wait", start=False),
    )
    cleanup += [done, busy, waiting]
    wait_for_phase(double, done.master.name, "Succeeded")
    wait_for_phase(double, busy.master.name, "Running")
    age(double, done.job_name, 3)

    code, out, _ = cli("jobs", "--namespace", "default")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "DAG", "TASK", "RUN", "TRY", "PHASE", "AGE", "READY", "BACKEND"]
    table = {row.split()[0]: row.split() for row in rows}
    assert next(iter(table)) == done.job_name  # oldest first
    assert set(table) == {done.job_name, busy.job_name, waiting.job_name}
    assert table[done.job_name][1:] == ["etl", "done", "scheduled__2026-11-30", "2", "Succeeded", "3h", "2/3", "pods"]
    # (the workers still run: a job left by a dead task is stopped by nobody)
    assert table[busy.job_name][5] == "Running" and table[busy.job_name][7].endswith("/3")
    assert table[waiting.job_name][5] == "Starting" and table[waiting.job_name][7] == "2/2"
    # The columns line up: every row's phase starts where the header's PHASE does.
    column = header.index("PHASE")
    assert all(row[column:].split()[0] in ("Succeeded", "Running", "Starting") for row in rows)

    code, out, _ = cli("jobs", "--json")
    listed = {job["name"]: job for job in json.loads(out)}
    assert (
        listed[done.job_name]["why"] == "the master succeeded"
        and listed[busy.job_name]["ready"] == table[busy.job_name][7]
    )
    # Listing reads no Secret (no job's private key crosses the wire), and of our ConfigMaps
    # only their metadata (labels, annotations, owner, age).
    assert double.request_count("GET", "/secrets") == 0
    assert double.metadata_lists == ["configmaps", "configmaps"]


def test_jobs_in_an_empty_namespace_says_so(cli: Callable[..., tuple[int, str, str]]) -> None:
    assert cli("jobs") == (0, "no airflow-mpi jobs in namespace default\n", "")


def test_logs_prints_the_masters_lines_and_follows_them_live(
    cli: Callable[..., tuple[int, str, str]],
    backend: KubernetesBackend,
    double: KubeDouble,
    scripts: Scripts,
    cleanup: list[JobPlan],
) -> None:
    def slow() -> Iterator[str]:
        for epoch in range(5):
            time.sleep(0.2)
            yield f"[1,0]<stdout>:epoch {epoch}"

    plan = leave_job(backend, scripts, "logged", PodScript(lines=slow, exit_code=0))
    cleanup.append(plan)
    code, out, _ = cli("logs", plan.job_name, "-f")  # from the start, until the master ends
    assert code == 0
    assert [line for line in out.splitlines() if "epoch" in line] == [f"[1,0]<stdout>:epoch {i}" for i in range(5)]
    code, again, _ = cli("logs", plan.job_name)  # the log as it is now, once
    assert code == 0 and again == out


def test_logs_show_a_rewritten_line_once_in_its_final_state(
    cli: Callable[..., tuple[int, str, str]],
    backend: KubernetesBackend,
    double: KubeDouble,
    scripts: Scripts,
    cleanup: list[JobPlan],
) -> None:
    def bar() -> Iterator[str]:
        for percent in (10, 50, 100):
            time.sleep(0.1)
            yield f"[1,0]<stdout>:bar {percent}%\r"
        yield "\n[1,0]<stdout>:done\n"

    plan = leave_job(backend, scripts, "bar", PodScript(writes=bar, exit_code=0))
    cleanup.append(plan)
    for follow in (["-f"], []):
        code, out, _ = cli("logs", plan.job_name, *follow)
        assert code == 0 and out.splitlines()[-2:] == ["[1,0]<stdout>:bar 100%", "[1,0]<stdout>:done"], out
        assert "bar 10%" not in out and "\r" not in out


def test_logs_and_delete_of_an_unknown_job_say_so(cli: Callable[..., tuple[int, str, str]]) -> None:
    for command in ("logs", "delete"):
        code, out, err = cli(command, "nosuch-0123abcd")
        assert code == 1 and out == ""
        assert err == (
            "airflow-mpi: no job nosuch-0123abcd in namespace default: `airflow-mpi jobs --namespace default` "
            "lists the jobs there\n"
        )


def test_delete_waits_until_nothing_of_the_job_is_left(
    cli: Callable[..., tuple[int, str, str]],
    backend: KubernetesBackend,
    double: KubeDouble,
    scripts: Scripts,
    cleanup: list[JobPlan],
) -> None:
    running = PodScript(lines=lambda: iter(["[1,0]<stdout>:epoch 1"]))
    plan, other = leave_job(backend, scripts, "doomed", running), leave_job(backend, scripts, "other", running)
    cleanup.append(other)
    assert len(job_objects(double, plan.job_name)) == 7
    code, out, _ = cli("delete", plan.job_name)
    assert (code, out) == (0, f"deleted job {plan.job_name} in namespace default (nothing of it is left)\n")
    assert job_objects(double, plan.job_name) == []  # at once: the command waited
    assert len(job_objects(double, other.job_name)) == 7  # and touched no other job


def test_gc_dry_run_says_what_and_why_and_deletes_nothing_then_yes_deletes(
    cli: Callable[..., tuple[int, str, str]],
    backend: KubernetesBackend,
    double: KubeDouble,
    scripts: Scripts,
    cleanup: list[JobPlan],
) -> None:
    done = PodScript(lines=lambda: iter(["[1,0]<stdout>:done"]), exit_code=0)
    ok = leave_job(backend, scripts, "ok", done)
    bad = leave_job(backend, scripts, "bad", PodScript(lines=lambda: iter(["[1,1]<stderr>:boom"]), exit_code=3))
    live = leave_job(backend, scripts, "live", PodScript(lines=lambda: iter(["[1,0]<stdout>:epoch 1"])))
    young = leave_job(backend, scripts, "young", done)
    stuck = leave_job(backend, scripts, "stuck", start=False)
    cleanup += [ok, bad, live, young, stuck]
    for plan in (ok, bad, live, stuck):
        age(double, plan.job_name, 2)
    wait_for_phase(double, ok.master.name, "Succeeded")
    wait_for_phase(double, bad.master.name, "Failed")
    wait_for_phase(double, young.master.name, "Succeeded")
    wait_for_phase(double, live.master.name, "Running")

    code, out, _ = cli("gc", "--older-than", "1h")
    assert code == 0
    lines = {next(word for word in line.split() if word.endswith(":"))[:-1]: line for line in out.splitlines()[:-1]}
    assert lines[ok.job_name] == f"would delete  {ok.job_name}: finished: the master succeeded"
    assert lines[bad.job_name].startswith(f"would delete  {bad.job_name}: finished: pod {bad.master.name} (master)")
    assert "exit code 3" in lines[bad.job_name]
    assert lines[stuck.job_name].startswith(f"would delete  {stuck.job_name}: no master pod yet (2 of 2 workers ready)")
    assert lines[live.job_name].startswith(f"keep          {live.job_name}: running: the master is running; a retry")
    assert lines[young.job_name] == f"keep          {young.job_name}: younger than 1h"
    assert out.splitlines()[-1] == "3 of 5 job(s) in namespace default would be deleted: run again with --yes"
    assert all(job_objects(double, p.job_name) for p in (ok, bad, live, young, stuck))  # a dry run

    code, out, _ = cli("gc", "--older-than", "1h", "--yes")
    assert code == 0
    assert f"deleted       {ok.job_name}: finished: the master succeeded" in out.splitlines()
    assert out.splitlines()[-1] == "3 of 5 job(s) in namespace default deleted"
    assert [p.job_name for p in (ok, bad, live, young, stuck) if not job_objects(double, p.job_name)] == [
        ok.job_name,
        bad.job_name,
        stuck.job_name,
    ]


SPEC = """
name: clijob
image: registry.example/train:1
command: [python, /app/train.py]
workers: {replicas: 2}
"""


def test_run_on_kubernetes_streams_the_log_and_exits_with_the_jobs_code(
    cli: Callable[..., tuple[int, str, str]], double: KubeDouble, scripts: Scripts, tmp_path: Path
) -> None:
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:epoch 1", "[1,1]<stderr>:boom"]), exit_code=3))
    (tmp_path / "job.yaml").write_text(SPEC)
    code, out, err = cli("run", str(tmp_path / "job.yaml"), "--backend", "kubernetes", "--run-id", "r1")
    assert code == 3
    assert "[1,0]<stdout>:epoch 1" in out and "[1,1]<stderr>:boom" in out
    assert "pod clijob-" in err and "exit code 3" in err and "Traceback" not in err
    assert job_objects(double) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_run_on_kubernetes_interrupted_deletes_the_job(
    kubeconfig: str, double: KubeDouble, scripts: Scripts, tmp_path: Path, signum: int
) -> None:
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:epoch 1"])))  # runs until deleted
    (tmp_path / "job.yaml").write_text(SPEC)
    command = [
        sys.executable,
        "-m",
        "airflow_mpi.cli.main",
        "run",
        str(tmp_path / "job.yaml"),
        "--backend",
        "kubernetes",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [*command, "--kubeconfig", kubeconfig],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=sigint_as_from_a_terminal,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while "epoch 1" not in proc.stdout.readline() and time.monotonic() < deadline:
            pass
        assert job_objects(double)  # running
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert "interrupted; job clijob-" in err and "removed" in err and "Traceback" not in err
    assert job_objects(double) == []


def test_unreachable_api_forbidden_and_expired_credentials_are_one_clear_line(
    cli: Callable[..., tuple[int, str, str]], double: KubeDouble
) -> None:
    double.deny("list", "configmaps")
    code, _, err = cli("jobs")
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "cannot `list` `configmaps` in namespace default (403 Forbidden)" in err

    double.expire_credentials()
    code, _, err = cli("gc", "--older-than", "1d")
    assert code == 1 and "refused the credentials (401 Unauthorized)" in err
    double.expire_credentials(False)

    double.refuse_connections()
    started = time.monotonic()
    code, _, err = cli("jobs", "--api-timeout", "2")
    assert code == 1 and f"the Kubernetes API at {double.url} did not answer" in err and "connection refused" in err
    assert time.monotonic() - started < 15
    double.accept_connections()


def test_bad_arguments_are_refused_before_any_request(
    cli: Callable[..., tuple[int, str, str]], double: KubeDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli("gc", "--older-than", "soon")
    assert "'soon' is not a duration: give a number with a unit, e.g. 90s" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli("delete", "Not_A_Job")
    assert main(["jobs", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert f"no kubeconfig at {tmp_path / 'missing'}: give --kubeconfig PATH" in capsys.readouterr().err
    assert double.request_count() == 0


def test_an_airflow_connection_names_the_cluster_and_namespace(
    double: KubeDouble,
    backend: KubernetesBackend,
    scripts: Scripts,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cleanup: list[JobPlan],
) -> None:
    install_connections(monkeypatch, double)
    cleanup.append(leave_job(backend, scripts, "viaconn"))
    for conn_id in ("mpi_k8s", "kube_double"):  # the mpi connection, or the Kubernetes one itself
        assert main(["jobs", "--conn-id", conn_id]) == 0
        assert cleanup[0].job_name in capsys.readouterr().out
    monkeypatch.setenv("AIRFLOW_CONN_MPI_LOCAL", json.dumps({"conn_type": "mpi", "extra": {"backend": "local"}}))
    assert main(["jobs", "--conn-id", "mpi_local"]) == 1
    assert "connection 'mpi_local' uses the local backend" in capsys.readouterr().err


def test_run_on_kubernetes_runs_a_real_mpi_job(real_double: KubeDouble, tmp_path: Path) -> None:
    """Pods run for real (sshd, mpiexec, mpi4py): run this test alone, under the machine lock."""
    job = {
        "name": "clireal",
        "image": "registry.example/airflow-mpi-train:0.1",
        "command": [
            sys.executable,
            "-c",
            "from mpi4py import MPI; c = MPI.COMM_WORLD; print('rank', c.rank, 'of', c.size, 'sum', c.allreduce(1))",
        ],
        "workers": {"replicas": 2},
        "startup_timeout": 60,
        "timeout": 120,
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(real_double.kubeconfig()))
    command = [
        sys.executable,
        "-m",
        "airflow_mpi.cli.main",
        "run",
        str(tmp_path / "job.yaml"),
        "--backend",
        "kubernetes",
    ]
    done = subprocess.run(
        [*command, "--kubeconfig", str(tmp_path / "kubeconfig")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert {f"rank {rank} of 3 sum 3" for rank in range(3)} <= {
        line.split(">:", 1)[-1] for line in done.stdout.splitlines()
    }
    assert "airflow-mpi: done in" in done.stdout
    assert job_objects(real_double) == []
