"""Gang-scheduled jobs end to end through Airflow (``dag.test()``), waiting in the worker and
deferred to the triggerer: the Volcano Job backend and the Kubernetes backend with each gang
setting, against the API double and its gang controllers; nothing is left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.airflow_helpers import task_states, xcom
from tests.doubles.gang_controllers import GangControllers
from tests.doubles.kube_double import LEASES, KubeDouble, ScriptedKubelet
from tests.k8s.conftest import Scripts, install_connections
from tests.k8s.test_gang import CUSTOM_PLURALS, _crd_validator


@pytest.fixture
def gang_cluster(scripts: Scripts, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KubeDouble, GangControllers]]:
    kube = KubeDouble(ScriptedKubelet(scripts))
    controllers = GangControllers(kube, gpus_per_node=[4])
    kube.custom_validator = _crd_validator
    kube.start()
    install_connections(monkeypatch, kube)
    extra = {"backend": "volcano", "kubernetes_conn_id": "kube_double", "namespace": "default"}
    monkeypatch.setenv("AIRFLOW_CONN_MPI_VOLCANO", json.dumps({"conn_type": "mpi", "extra": extra}))
    yield kube, controllers
    controllers.stop()
    kube.stop()


def test_gang_jobs_succeed_waiting_and_deferred(dagbag: Any, gang_cluster: tuple[KubeDouble, GangControllers]) -> None:
    kube, controllers = gang_cluster
    dag_run = dagbag.get_dag("mpi_test_gang").test()
    states = task_states(dag_run)
    assert len(states) == 8 and set(states.values()) == {"success"}, states
    for task_id in states:
        result = xcom(dag_run, task_id)
        assert result["exit_code"] == 0 and result["lines"] >= 1, (task_id, result)
    assert len([line for line in controllers.log if line.startswith("admitted")]) == 8
    for plural in ("pods", "services", "secrets", "configmaps", LEASES, *CUSTOM_PLURALS, "workloads.kueue.x-k8s.io"):
        assert kube.list_objects(plural, "default") == [], plural
