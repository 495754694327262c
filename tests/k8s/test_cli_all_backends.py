"""`airflow-mpi jobs | logs | delete | gc | run` for jobs of every Kubernetes backend at once: plain
pods, a Volcano Job (the double's Volcano job controller makes its pods) and an MPIJob (the
double's mpi-operator makes the workers and a launcher pod `<job>-launcher-<random>`), over real
HTTP. Each job is listed with the backend that made it, logged from its own master pod, deleted
through its own top object until nothing of it is left, and collected by the same rules."""

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
from typing import Any

import pytest
import yaml

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.cli.main import main
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan
from airflow_mpi.kinds.registry import job_kind, kind_of
from airflow_mpi.observe.status import pod_state_from_k8s
from airflow_mpi.runner.retries import plan_for
from airflow_mpi.spec import MPIJobSpec
from tests.doubles.gang_controllers import GangControllers
from tests.doubles.kube_double import KubeDouble, PodScript, ScriptedKubelet
from tests.doubles.mpijob_controller import MPIJobController
from tests.k8s.conftest import Scripts, api_client_for, install_connections, sigint_as_from_a_terminal
from tests.k8s.test_gang import _crd_validator

NS = "default"
REPO = Path(__file__).resolve().parents[2]
KINDS = ("pods", "volcano", "mpijob")
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def kube(scripts: Scripts) -> Iterator[KubeDouble]:
    """The double with both controllers: Volcano's (and the gang plugins) and mpi-operator."""
    double = KubeDouble(ScriptedKubelet(scripts))
    gangs, operator = GangControllers(double), MPIJobController(double)
    double.custom_validator = _crd_validator
    double.start()
    yield double
    operator.stop()
    gangs.stop()
    double.stop()


def everything(kube: KubeDouble) -> list[str]:
    """Every object in the namespace, of any kind (ours, the controllers', custom ones)."""
    return sorted(f"{plural}/{name}" for plural, ns, name in list(kube.objects) if ns == NS and plural != "events")


def of_job(kube: KubeDouble, job: str) -> list[str]:
    """What is left of one job: what carries its label or its name (the controllers' objects)."""
    return [item for item in everything(kube) if job in item] + [
        f"pods/{pod['metadata']['name']}"
        for pod in kube.list_objects("pods", NS, f"airflow-mpi.io/job={job}")
        if job not in pod["metadata"]["name"]
    ]


class Jobs:
    """Jobs left on the cluster as a dead Airflow worker leaves them, one backend each."""

    def __init__(self, kube: KubeDouble, scripts: Scripts) -> None:
        self.kube, self.scripts = kube, scripts
        self.backends = {
            kind: KubernetesBackend(kind=kind, api_client=api_client_for(kube), namespace=NS) for kind in KINDS
        }
        self.left: list[tuple[str, JobPlan]] = []

    def leave(self, kind: str, task: str, master: PodScript | None = None) -> JobPlan:
        backend = self.backends[kind]
        spec = MPIJobSpec.from_dict(
            {"name": task, "image": "registry.example/train:1", "command": ["python"], "workers": {"replicas": 2}}
        )
        plan = plan_for(backend, spec, RunIdentity("etl", task, "scheduled__2026-11-30", try_number=2))
        self.scripts.on(plan.master.name, master or PodScript(lines=lambda: iter(["[1,0]<stdout>:hello"]), exit_code=0))
        backend.create(plan)
        if kind == "pods":  # the others' controllers start the master with the workers
            deadline = time.monotonic() + 10
            while not all(p.ok for p in backend.probe_workers(plan.job_name)) and time.monotonic() < deadline:
                backend.wait_for_change(plan.job_name, 0.2)
            backend.start_master(plan.job_name)
        backend.release(plan.job_name)
        self.left.append((kind, plan))
        return plan

    def master_phase(self, job: str, phase: str) -> None:
        """Wait until the job's master pod (its newest, for an MPIJob's launcher) is in ``phase``."""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            pods = self.kube.list_objects("pods", NS, f"airflow-mpi.io/job={job},airflow-mpi.io/role=master")
            newest = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")[-1:]
            if newest and newest[0].get("status", {}).get("phase") == phase:
                return
            time.sleep(0.05)
        raise AssertionError(f"the master of {job} never reached {phase}")

    def age(self, job: str, hours: float) -> None:
        """Make the job look ``hours`` old (its Secret's and ConfigMap's creation time is its age)."""
        stamp = (datetime.now(timezone.utc) - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
        for plural in ("secrets", "configmaps"):
            for obj in self.kube.list_objects(plural, NS, f"airflow-mpi.io/job={job}"):
                self.kube.update_object(
                    plural,
                    NS,
                    obj["metadata"]["name"],
                    lambda o: o["metadata"].__setitem__("creationTimestamp", stamp),
                )


@pytest.fixture
def jobs(kube: KubeDouble, scripts: Scripts) -> Iterator[Jobs]:
    left = Jobs(kube, scripts)
    yield left
    for kind, plan in left.left:
        left.backends[kind].teardown(plan.job_name)
    deadline = time.monotonic() + 15
    while everything(kube) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert everything(kube) == []


@pytest.fixture
def cli(tmp_path: Path, kube: KubeDouble, capsys: pytest.CaptureFixture[str]) -> Cli:
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kube.kubeconfig()))

    def run(*args: str) -> tuple[int, str, str]:
        code = main([*args, "--kubeconfig", str(tmp_path / "kubeconfig")])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def forever(line: str) -> PodScript:
    return PodScript(lines=lambda: iter([f"[1,0]<stdout>:{line}"]))  # runs until deleted


def test_jobs_lists_every_backends_jobs_with_the_backend_that_made_each(cli: Cli, jobs: Jobs) -> None:
    plain = jobs.leave("pods", "plain", forever("epoch 1"))
    gang = jobs.leave("volcano", "gang")
    operator = jobs.leave("mpijob", "operator")
    busy = jobs.leave("mpijob", "busy", forever("epoch 1"))
    jobs.master_phase(plain.job_name, "Running")
    jobs.master_phase(gang.job_name, "Succeeded")
    jobs.master_phase(operator.job_name, "Succeeded")
    jobs.master_phase(busy.job_name, "Running")
    jobs.age(gang.job_name, 3)

    code, out, _ = cli("jobs")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "DAG", "TASK", "RUN", "TRY", "PHASE", "AGE", "READY", "BACKEND"]
    table = {row.split()[0]: row.split() for row in rows}
    assert next(iter(table)) == gang.job_name  # oldest first
    assert {name: cells[8] for name, cells in table.items()} == {
        plain.job_name: "pods",
        gang.job_name: "volcano",
        operator.job_name: "mpijob",
        busy.job_name: "mpijob",
    }
    assert table[gang.job_name][1:8] == ["etl", "gang", "scheduled__2026-11-30", "2", "Succeeded", "3h", "0/1"]
    # The launcher counts as the master; the workers the operator removed after it do not.
    assert table[operator.job_name][5:6] + table[operator.job_name][7:8] == ["Succeeded", "0/1"]
    assert table[busy.job_name][5] == "Running" and table[busy.job_name][7].endswith("/3")  # launcher + 2 workers
    assert table[plain.job_name][5] == "Running"
    # The columns line up: every row's backend starts where the header's BACKEND does.
    column = header.index("BACKEND")
    assert all(row[column:].split()[0] in ("pods", "volcano", "mpijob") for row in rows)
    code, out, _ = cli("jobs", "--json")
    assert {job["name"]: job["backend"] for job in json.loads(out)} == {name: row[8] for name, row in table.items()}


def test_logs_read_and_follow_a_volcano_jobs_master_and_an_mpijobs_launcher(cli: Cli, jobs: Jobs) -> None:
    def slow(tag: str) -> Callable[[], Iterator[str]]:
        def lines() -> Iterator[str]:
            for epoch in range(4):
                time.sleep(0.2)
                yield f"[1,0]<stdout>:{tag} epoch {epoch}"

        return lines

    for kind in ("volcano", "mpijob"):
        plan = jobs.leave(kind, f"log{kind[:3]}", PodScript(lines=slow(kind), exit_code=0))
        code, out, _ = cli("logs", plan.job_name, "-f")  # from the start, until the master ends
        assert code == 0
        assert [line for line in out.splitlines() if "epoch" in line] == [
            f"[1,0]<stdout>:{kind} epoch {i}" for i in range(4)
        ]
        code, again, _ = cli("logs", plan.job_name)  # the log as it is now, once
        assert code == 0 and again == out


def test_delete_goes_through_each_jobs_own_top_object_and_waits_until_nothing_is_left(
    cli: Cli, jobs: Jobs, kube: KubeDouble
) -> None:
    keep = jobs.leave("pods", "keep", forever("epoch 1"))
    doomed = [jobs.leave("volcano", "vdoomed", forever("epoch 1")), jobs.leave("mpijob", "mdoomed", forever("e 1"))]
    for plan in [keep, *doomed]:
        jobs.master_phase(plan.job_name, "Running")
    kept = of_job(kube, keep.job_name)
    assert any(item.startswith("jobs.batch.volcano.sh/") for item in of_job(kube, doomed[0].job_name))
    assert {"mpijobs.kubeflow.org", "jobs.batch", "services"} <= {
        item.split("/")[0] for item in of_job(kube, doomed[1].job_name)
    }  # the MPIJob, its launcher Job and the operator's Service: not ours, but of the job
    for plan in doomed:
        code, out, err = cli("delete", plan.job_name)
        assert (code, out, err) == (
            0,
            f"deleted job {plan.job_name} in namespace default (nothing of it is left)\n",
            "",
        )
        assert of_job(kube, plan.job_name) == []  # at once: the command waited
    assert of_job(kube, keep.job_name) == kept  # and touched no other job
    # Through each one's top object, as its backend's teardown deletes it.
    assert kube.request_count("DELETE", f"/batch.volcano.sh/v1alpha1/namespaces/default/jobs/{doomed[0].job_name}") == 1
    assert kube.request_count("DELETE", f"/kubeflow.org/v2beta1/namespaces/default/mpijobs/{doomed[1].job_name}") == 1
    code, _, err = cli("delete", doomed[1].job_name)
    assert code == 1 and f"no job {doomed[1].job_name} in namespace default" in err


def test_gc_decides_the_same_way_for_every_backend(cli: Cli, jobs: Jobs, kube: KubeDouble) -> None:
    done = PodScript(lines=lambda: iter(["[1,0]<stdout>:done"]), exit_code=0)
    finished = {kind: jobs.leave(kind, f"ok{kind[:3]}", done) for kind in ("pods", "volcano", "mpijob")}
    failed = jobs.leave("mpijob", "bad", PodScript(lines=lambda: iter(["[1,1]<stderr>:boom"]), exit_code=3))
    running = jobs.leave("volcano", "live", forever("epoch 1"))
    young = jobs.leave("mpijob", "young", done)
    for plan in [*finished.values(), failed, running, young]:
        jobs.master_phase(plan.job_name, "Failed" if plan is failed else "Running" if plan is running else "Succeeded")
        if plan is not young:
            jobs.age(plan.job_name, 2)

    code, out, _ = cli("gc", "--older-than", "1h")
    assert code == 0
    lines = {
        plan.job_name: next(line for line in out.splitlines() if f" {plan.job_name}:" in line) for _, plan in jobs.left
    }
    for plan in finished.values():
        assert lines[plan.job_name] == f"would delete  {plan.job_name}: finished: the master succeeded"
    assert lines[failed.job_name].startswith(f"would delete  {failed.job_name}: finished: pod {failed.master.name}")
    assert lines[running.job_name].startswith(f"keep          {running.job_name}: running: the master is running")
    assert lines[young.job_name] == f"keep          {young.job_name}: younger than 1h"
    assert out.splitlines()[-1] == "4 of 6 job(s) in namespace default would be deleted: run again with --yes"
    assert all(of_job(kube, plan.job_name) for _, plan in jobs.left)  # a dry run

    code, out, _ = cli("gc", "--older-than", "1h", "--yes")
    assert code == 0 and out.splitlines()[-1] == "4 of 6 job(s) in namespace default deleted"
    gone = [plan.job_name for _, plan in jobs.left if not of_job(kube, plan.job_name)]
    assert gone == [plan.job_name for plan in [*finished.values(), failed]]


@pytest.mark.parametrize("kind", ["volcano", "mpijob"])
def test_run_on_volcano_or_mpijob_streams_the_log_and_exits_with_the_jobs_code(
    cli: Cli, kube: KubeDouble, scripts: Scripts, tmp_path: Path, kind: str
) -> None:
    master = "-launcher-" if kind == "mpijob" else "-master-"
    scripts.on(master, PodScript(lines=lambda: iter(["[1,0]<stdout>:epoch 1", "[1,1]<stderr>:boom"]), exit_code=3))
    job = {"name": "clijob", "image": "registry.example/train:1", "command": ["python"], "workers": {"replicas": 2}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    code, out, err = cli("run", str(tmp_path / "job.yaml"), "--backend", kind, "--run-id", "r1")
    assert code == 3, err
    assert "[1,0]<stdout>:epoch 1" in out and "[1,1]<stderr>:boom" in out
    assert "exit code 3" in err and "Traceback" not in err
    assert everything(kube) == []


def test_run_with_an_mpi_connection_runs_on_the_backend_the_connection_names(
    kube: KubeDouble,
    scripts: Scripts,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No --backend: the connection's own (an MPIJob here), not the local backend.
    install_connections(monkeypatch, kube, mpi_conn_id="mpi_mpijob", backend="mpijob")
    scripts.on("-launcher-", PodScript(lines=lambda: iter(["[1,0]<stdout>:epoch 1"]), exit_code=0))
    job = {"name": "viaconn", "image": "registry.example/train:1", "command": ["python"], "workers": {"replicas": 2}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    code = main(["run", str(tmp_path / "job.yaml"), "--conn-id", "mpi_mpijob", "--run-id", "r1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "on the mpijob backend" in out and "[1,0]<stdout>:epoch 1" in out, out
    assert everything(kube) == []


@pytest.mark.parametrize("kind", ["volcano", "mpijob"])
def test_run_on_volcano_or_mpijob_interrupted_deletes_the_job_and_what_its_controller_made(
    kube: KubeDouble, scripts: Scripts, tmp_path: Path, kind: str
) -> None:
    scripts.on("-launcher-" if kind == "mpijob" else "-master-", forever("epoch 1"))
    job = {"name": "clijob", "image": "registry.example/train:1", "command": ["python"], "workers": {"replicas": 2}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kube.kubeconfig()))
    command = [sys.executable, "-m", "airflow_mpi.cli.main", "run", str(tmp_path / "job.yaml"), "--backend", kind]
    proc = subprocess.Popen(
        [*command, "--kubeconfig", str(tmp_path / "kubeconfig")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=sigint_as_from_a_terminal,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while "epoch 1" not in proc.stdout.readline() and time.monotonic() < deadline:
            pass
        assert everything(kube)  # running
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted; job clijob-" in err and "Traceback" not in err
    assert everything(kube) == []


def test_an_mpi_connection_of_the_volcano_or_mpijob_backend_names_the_cluster(
    jobs: Jobs, kube: KubeDouble, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = jobs.leave("mpijob", "viaconn")
    for backend in ("volcano", "mpijob"):
        install_connections(monkeypatch, kube, mpi_conn_id=f"mpi_{backend}", backend=backend)
        assert main(["jobs", "--conn-id", f"mpi_{backend}"]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(plan.job_name))
        assert row.split()[-1] == "mpijob"


def test_an_mpijobs_newest_launcher_pod_decides_its_phase() -> None:
    """The launcher's batch Job replaces a failed launcher pod: the newest is the master."""

    def launcher(suffix: str, created: str, phase: str) -> dict[str, Any]:
        return {
            "metadata": {
                "name": f"mj-0123abcd-launcher-{suffix}",
                "creationTimestamp": created,
                "labels": {"airflow-mpi.io/role": "master"},
            },
            "status": {"phase": phase, "containerStatuses": [{"state": {"running": {}}}]},
        }

    old, new = launcher("zzzzz", "2027-01-15T06:00:00Z", "Failed"), launcher("aaaaa", "2027-01-15T06:00:09Z", "Running")
    states = job_kind("mpijob").listed_states([old, new])
    assert [(s.name, s.phase.value) for s in states] == [(new["metadata"]["name"], "Running")]
    assert len(job_kind("pods").listed_states([old, new])) == 2
    assert pod_state_from_k8s(old).phase.value == "Failed"


def test_each_backend_claims_its_jobs_objects_by_their_owner() -> None:
    """Our Secret (or a pod) says which backend made the job; an unowned Secret is an MPIJob's
    (that backend alone creates it before its owner)."""

    def owned_by(api_version: str, kind: str, **labels: str) -> dict[str, Any]:
        refs = [{"apiVersion": api_version, "kind": kind, "name": "j"}]
        return {"metadata": {"ownerReferences": refs, "labels": labels}}

    assert [
        kind_of(obj).name
        for obj in (
            owned_by("v1", "Service"),
            owned_by("batch.volcano.sh/v1alpha1", "Job"),
            owned_by("kubeflow.org/v2beta1", "MPIJob"),
            # the launcher pod, owned by the operator's batch Job and labelled by it
            owned_by("batch/v1", "Job", **{"training.kubeflow.org/job-name": "j"}),
            {"metadata": {}},
        )
    ] == ["pods", "volcano", "mpijob", "mpijob", "mpijob"]


def test_a_volcano_jobs_workers_its_policy_is_deleting_do_not_count() -> None:
    def pod(role: str, phase: str, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"v-0123abcd-{role}-0", "labels": {"airflow-mpi.io/role": role}}
        if deleting:
            meta["deletionTimestamp"] = "2027-01-15T06:00:00Z"
        return {"metadata": meta, "status": {"phase": phase, "containerStatuses": [{"state": {"running": {}}}]}}

    master, worker = pod("master", "Succeeded"), pod("worker", "Running", deleting=True)
    volcano = job_kind("volcano")
    assert [state.name for state in volcano.listed_states([master, worker])] == [master["metadata"]["name"]]
    assert len(volcano.listed_states([pod("master", "Running"), pod("worker", "Running")])) == 2
