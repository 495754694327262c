"""MPIJobOperator and SshdReadySensor under real Airflow (dag.test()), on the local backend."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.exceptions import SpecError
from tests.airflow_helpers import task_states, xcom

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_failing_rank_fails_the_task_naming_rank_pod_and_code(dagbag: Any, capfd: pytest.CaptureFixture[str]) -> None:
    dag_run = dagbag.get_dag("mpi_test_fail").test()
    assert task_states(dag_run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert re.search(r"rank 1 on pod failing-[a-z2-7]{13}-worker-0 exited with code 3", out), out[-3000:]
    assert "[1,1]<stdout>:rank 1 up" in out  # rank output was streamed into the task log


def test_templated_job_and_xcom_result(dagbag: Any) -> None:
    dag_run = dagbag.get_dag("mpi_test_templated").test(run_conf={"workers": 2, "word": "bonjour"})
    assert task_states(dag_run) == {"train": "success"}
    result = xcom(dag_run, "train")
    assert result["result"] == {"word": "bonjour", "size": 3}
    assert result["np"] == 3 and result["exit_code"] == 0
    assert set(result["durations_s"]) == {"create", "sshd_ready", "mpiexec", "total"}
    assert "PRIVATE" not in repr(result)  # keys never reach XCom


def test_sensor_times_out_with_a_reason_per_host(
    dagbag: Any, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from airflow_mpi.hooks.mpi import MPIJobHook
    from airflow_mpi.job.naming import RunIdentity
    from airflow_mpi.job.plan import render_plan
    from airflow_mpi.spec import MPIJobSpec

    fake = Path("/var/tmp/airflow-mpi-tests") / f"fake-sshd-{time.time_ns()}"
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text("#!/bin/bash\nexec sleep 300\n")
    fake.chmod(0o755)
    backend = MPIJobHook().get_backend()
    plan = render_plan(
        MPIJobSpec.from_dict({"name": "sensed", "command": ["true"], "workers": {"replicas": 2}}),
        RunIdentity("t", "t", f"sensor-{time.time_ns()}"),
    )
    plan = dataclasses.replace(
        plan,
        pods=tuple(
            dataclasses.replace(p, env={**p.env, "AIRFLOW_MPI_SSHD": str(fake)}) if p.role.value == "worker" else p
            for p in plan.pods
        ),
    )
    try:
        backend.create(plan)
        started = time.monotonic()
        dag_run = dagbag.get_dag("mpi_test_sensor").test(run_conf={"job_name": plan.job_name})
        elapsed = time.monotonic() - started
    finally:
        backend.teardown(plan.job_name)
        fake.unlink()
    assert task_states(dag_run) == {"wait_for_sshd": "failed"}
    out = capfd.readouterr().out
    for worker in plan.workers:
        assert f"{worker.host}: port closed: nothing listens on port 22" in out
    assert "2 of 2 worker host(s) did not accept ssh" in out
    assert elapsed < 4 + 5 + 15  # startup timeout + 5 s, plus dag.test()'s own start-up


def test_bad_spec_fails_at_dag_definition() -> None:
    from airflow_mpi.operators.mpi import MPIJobOperator

    with pytest.raises(SpecError) as caught:
        MPIJobOperator(task_id="t", job={"name": "x", "command": ["deepspeed", "t.py"], "master": {"replicas": 2}})
    assert set(caught.value.fields) == {"command", "master.replicas"}


def test_operator_on_kill_removes_the_job() -> None:
    import threading
    from types import SimpleNamespace

    from airflow_mpi.operators.mpi import MPIJobOperator

    operator = MPIJobOperator(
        task_id="train", job={"name": "killed", "command": ["sleep", "120"], "workers": {"replicas": 1}}
    )
    ti = SimpleNamespace(dag_id="d", task_id="train", run_id=f"kill-{time.time_ns()}", map_index=-1, try_number=1)
    errors: list[BaseException] = []

    def execute() -> None:
        try:
            operator.execute({"ti": ti})  # type: ignore[arg-type]
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=execute)
    thread.start()
    deadline = time.monotonic() + 30
    while (operator._runner is None or operator._runner.output.lines_seen < 3) and time.monotonic() < deadline:
        time.sleep(0.05)  # MPI_HOST, MPI_HOSTS, MPI_NP printed: mpiexec is starting
    operator.on_kill()
    thread.join(15)
    assert not thread.is_alive()
    assert operator._runner is not None
    assert operator._runner.backend.leftovers(operator._runner.job_name) == []


SMALL_JOB = {"name": "small", "command": ["true"], "workers": {"replicas": 1}}


def _context() -> dict[str, Any]:
    from types import SimpleNamespace

    return {"ti": SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1, try_number=1)}


def test_deferrable_defaults_to_airflows_setting_as_the_providers_operators_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_mpi.operators.mpi import MPIJobOperator

    assert MPIJobOperator(task_id="unset", job=SMALL_JOB).deferrable is False
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    by_default = MPIJobOperator(task_id="by_default", job=SMALL_JOB)
    assert (by_default.deferrable, by_default.deferrable_by_default) == (True, True)
    assert MPIJobOperator(task_id="explicit", job=SMALL_JOB, deferrable=False).deferrable is False


def test_the_configured_default_gives_way_on_the_local_backend_but_an_explicit_true_fails(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The local backend's pods live in the worker process: a task deferred only because of the
    configured default waits in the worker (and says so); one that asked to defer fails at once."""
    from airflow_mpi.compat import AirflowFailException
    from airflow_mpi.operators.mpi import MPIJobOperator

    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    monkeypatch.setenv("AIRFLOW_CONN_MPI_DEFAULT", '{"conn_type": "mpi", "extra": {"backend": "local"}}')
    by_default = MPIJobOperator(task_id="by_default", job=SMALL_JOB)
    _, _, backend = by_default._prepare(_context())
    assert backend.name == "local" and by_default.deferrable is False
    out, err = capfd.readouterr()
    assert "waits in the worker" in out + err
    asked = MPIJobOperator(task_id="asked", job=SMALL_JOB, deferrable=True)
    with pytest.raises(AirflowFailException, match="deferrable=True needs the kubernetes backend"):
        asked._prepare(_context())


def test_a_connection_id_that_does_not_exist_fails_the_task_before_anything_is_created(
    dagbag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """A mistyped ``mpi_conn_id`` must not run the job on the Airflow worker: the task fails,
    naming the id and how to create it, and no pod of the local backend was started
    (``no_leaks``: no namespace, sshd or mpiexec of ours)."""
    dag_run = dagbag.get_dag("mpi_test_missing_conn").test()
    assert task_states(dag_run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert "connection 'mpi_tpyo' does not exist" in out, out[-3000:]
    assert "airflow connections add mpi_tpyo --conn-type mpi" in out
    assert "never runs" not in out


def test_only_the_default_id_falls_back_to_the_local_backend_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_mpi.exceptions import BackendUnavailable
    from airflow_mpi.hooks.mpi import MPIJobHook

    said: list[tuple[str, str]] = []

    class Log:
        def warning(self, text: str, *args: Any) -> None:
            said.append(("warning", text % args))

        def info(self, text: str, *args: Any) -> None:
            said.append(("info", text % args))

    monkeypatch.setattr(MPIJobHook, "log", Log())
    monkeypatch.delenv("AIRFLOW_CONN_MPI_DEFAULT")  # the suite's own: local, with its state folder
    monkeypatch.setattr("airflow_mpi.hooks.mpi._WARNED_MISSING", set())
    hook = MPIJobHook()
    assert hook.get_backend().name == "local" and MPIJobHook().get_backend().name == "local"
    assert [level for level, text in said if "No connection 'mpi_default': this job runs on the local" in text] == [
        "warning"
    ]
    with pytest.raises(BackendUnavailable, match="connection 'mpi_other' does not exist"):
        MPIJobHook("mpi_other").get_backend()
