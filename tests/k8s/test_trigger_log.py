"""A deferred job's master log, followed live by its trigger (``dag.test()`` runs the trigger
inline): every line once, in order, rank-tagged as in waiting mode; the resumed operator shows
none of them again; the world-size check and result warnings work while deferred."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_mpi.testing.kube_double import KubeDouble, PodScript
from tests.airflow_helpers import task_states, xcom
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
