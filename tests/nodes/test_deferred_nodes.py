"""Deferrable mode on real Nodes: the trigger, not a worker slot, watches the job; a rank that
exits 3, a rank the kernel's OOM killer ends at its pod's memory limit, the job timeout, and a
stopped rank the hang watchdog finds (its trigger sees the silence, the resumed task takes the
stacks) each fail their task with the cause named, and leave nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.airflow_helpers import task_states
from tests.cluster.cluster import Cluster
from tests.cluster.conftest import install_connections, job_objects

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def test_deferred_rank_exit_oom_timeout_and_hang_fail_with_their_causes_named(
    dagbag: Any, cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    install_connections(monkeypatch, cluster.kubeconfig, namespace, mpi_conn_id="mpi_nodes")
    dag_run = dagbag.get_dag("mpi_test_nodes_deferred").test()
    out = capfd.readouterr().out
    states = {"rank_exit": "failed", "oom": "failed", "timeout": "failed", "hang": "failed"}
    assert task_states(dag_run) == states, out[-6000:]
    lines = out.splitlines()
    assert any("rank 2 on pod ndef-rankexit" in line and "exited with code 3" in line for line in lines), out[-6000:]
    assert any("ndef-oom" in line and "exit 137" in line and "256Mi" in line for line in lines), out[-6000:]
    assert any("ndef-timeout" in line and "timeout of 20s" in line for line in lines), out[-6000:]
    hung = [line for line in lines if "ndef-hang" in line and "hung: no rank printed a line for 15s" in line]
    assert hung, out[-6000:]
    assert any("ndef-hang" in line and "worker-0 did not answer: the process is stopped" in line for line in lines)
    assert sum("in allreduce_step" in line for line in lines) >= 2, out[-6000:]  # ranks 0 and 2
    assert job_objects(cluster.api(), namespace) == []
