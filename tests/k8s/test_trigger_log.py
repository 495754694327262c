"""A deferred job's master log, followed live by its trigger (``dag.test()`` runs the trigger
inline): every line once, in order, rank-tagged as in waiting mode; the resumed operator shows
none of them again; the world-size check and result warnings work while deferred."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.airflow_helpers import task_states, xcom
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects

LINES = 30


def paced(lines: list[str], every: float = 0.02) -> Iterator[str]:
    for line in lines:
        time.sleep(every)
        yield line


def numbered() -> list[str]:
    return [f"[1,0]<stdout>:line {i:03d}" for i in range(LINES)] + ['[1,0]<stdout>:AIRFLOW_MPI_RESULT {"ok": 1}']


@pytest.mark.usefixtures("connections")
def test_the_trigger_shows_each_line_once_and_the_resumed_task_none_again(
    dagbag: Any, double: KubeDouble, scripts: Scripts, capfd: pytest.CaptureFixture[str]
) -> None:
    scripts.on("-master-", PodScript(lines=lambda: paced(numbered()), exit_code=0))
    dag_run = dagbag.get_dag("mpi_test_k8s_deferred").test()
    out = capfd.readouterr().out
    assert task_states(dag_run) == {"train": "success"}, out[-3000:]
    shown = re.findall(r"<stdout>:line (\d{3})", out)
    assert shown == [f"{i:03d}" for i in range(LINES)], out[-3000:]
    assert xcom(dag_run, "train")["result"] == {"ok": 1}
    assert out.count("AIRFLOW_MPI_RESULT") == 1
    assert job_objects(double) == []


@pytest.mark.usefixtures("connections")
def test_while_deferred_a_refused_result_is_warned_and_a_wrong_world_size_fails_at_once(
    dagbag: Any, double: KubeDouble, scripts: Scripts, capfd: pytest.CaptureFixture[str]
) -> None:
    def master() -> Iterator[str]:
        yield "[1,0]<stdout>:AIRFLOW_MPI_RESULT not json"
        yield "[1,0]<stdout>:AIRFLOW_MPI_RANK_START rank=0 size=99 host=elsewhere"
        for i in range(300):  # the job would go on for a minute: the trigger must end it first
            time.sleep(0.2)
            yield f"[1,0]<stdout>:tick {i}"

    scripts.on("-master-", PodScript(lines=master, exit_code=0))
    started = time.monotonic()
    dag_run = dagbag.get_dag("mpi_test_k8s_deferred").test()
    out = capfd.readouterr().out
    assert task_states(dag_run) == {"train": "failed"}, out[-3000:]
    assert time.monotonic() - started < 45
    assert "airflow-mpi: WARNING: rank 0: its AIRFLOW_MPI_RESULT line is not JSON" in out
    assert "mpiexec started 99 rank(s) but the job has" in out
    assert "tick 299" not in out
    assert job_objects(double) == []


@pytest.mark.usefixtures("connections")
def test_while_deferred_a_dropped_log_stream_loses_and_repeats_no_line(
    dagbag: Any, double: KubeDouble, scripts: Scripts, capfd: pytest.CaptureFixture[str]
) -> None:
    """The trigger's follow resumes a cut stream from its byte cursor, as the waiting path does."""
    scripts.on("-master-", PodScript(lines=lambda: paced(numbered()), exit_code=0))
    double.drop_log_streams(after_lines=7, times=3)
    dag_run = dagbag.get_dag("mpi_test_k8s_deferred").test()
    out = capfd.readouterr().out
    assert task_states(dag_run) == {"train": "success"}, out[-3000:]
    shown = re.findall(r"<stdout>:line (\d{3})", out)
    assert shown == [f"{i:03d}" for i in range(LINES)], out[-3000:]
    assert double.request_count("GET", "/log") >= 4  # the first stream and three resumptions
    assert out.count("AIRFLOW_MPI_RESULT") == 1
    assert job_objects(double) == []


@pytest.mark.usefixtures("connections")
def test_while_deferred_a_master_its_kubelet_does_not_know_yet_is_followed_once_it_does(
    dagbag: Any, double: KubeDouble, scripts: Scripts, capfd: pytest.CaptureFixture[str]
) -> None:
    """A kubelet answers 404 for a pod it has not taken in yet (seen on the real control plane,
    where a controller creates the pods after the deferral): the pod is still in the watch, so
    the trigger retries rather than leaving every line to the resumed task."""
    scripts.on("-master-", PodScript(lines=lambda: paced(numbered(), every=0.05), exit_code=0))
    double.fail_requests(method="GET", path=r"-master-0/log", status=404, count=3)
    dag_run = dagbag.get_dag("mpi_test_k8s_deferred").test()
    out = capfd.readouterr().out
    assert task_states(dag_run) == {"train": "success"}, out[-3000:]
    records = re.split(r"\n(?=\d{4}-\d\d-\d\dT)", out)
    by_trigger = [n for record in records if "[airflow_mpi.master:" in record for n in re.findall(r"<stdout>:line (\d{3})", record)]  # fmt: skip
    assert by_trigger == [f"{i:03d}" for i in range(LINES)], out[-3000:]
    assert double.request_count("GET", "-master-0/log") >= 4  # three 404s, then the stream
    assert job_objects(double) == []


@pytest.mark.usefixtures("connections")
def test_a_silent_job_is_judged_hung_in_both_modes_and_ended(
    dagbag: Any, double: KubeDouble, scripts: Scripts, capfd: pytest.CaptureFixture[str]
) -> None:
    def master() -> Iterator[str]:
        yield from paced(["[airflow-mpi] starting mpiexec: 3 rank(s)", *(f"[1,0]<stdout>:step {i}" for i in range(3))])
        time.sleep(600)  # silent: the watchdog must end it within progress_timeout (3 s)
        yield "[1,0]<stdout>:never shown"

    scripts.on("-master-", PodScript(lines=master, exit_code=0))
    started = time.monotonic()
    dag_run = dagbag.get_dag("mpi_test_k8s_hang").test()
    out = capfd.readouterr().out
    assert task_states(dag_run) == {"waiting": "failed", "deferred": "failed"}, out[-4000:]
    assert time.monotonic() - started < 90, out[-4000:]
    for job in ("hangw", "hangd"):
        assert re.search(rf"MPI job {job}-\w+ hung: no rank printed a line for 3s \(progress_timeout\)", out), out[
            -4000:
        ]
    # The double answers no exec: each pod is named as not asked, nothing pretends to be a stack.
    assert "could not be asked for stacks" in out, out[-4000:]
    assert "rank 0 on pod" in out and "last line: step 2" in out, out[-4000:]
    assert "never shown" not in out
    assert job_objects(double) == []
