"""@task.mpi and mapped sweeps through Airflow (dag.test()), the Kubernetes backend and the API
double whose kubelet runs the pods for real: the function and its arguments travel in the job's
ConfigMap, every object passes the apiserver's validation, and nothing is left."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from airflow_mpi.decorators.taskflow import CALL_FILE, RUNNER_FILE
from airflow_mpi.job.naming import LABEL_MAP_INDEX, LABEL_TASK_ID
from tests.airflow_helpers import task_states, xcom
from tests.doubles.apivalidation import validate_object
from tests.doubles.kube_double import KubeDouble
from tests.k8s.conftest import install_connections, job_objects
from tests.k8s.test_mapped_tasks import PLURAL, task_instances


def test_task_mpi_waiting_and_deferred(dagbag: Any, real_double: KubeDouble) -> None:
    dag_run = dagbag.get_dag("mpi_test_taskflow_k8s").test(run_conf={"word": "salut"})
    assert task_states(dag_run) == {"waiting": "success", "deferred": "success"}
    for task_id in ("waiting", "deferred"):
        assert xcom(dag_run, task_id) == {"sum": 9.0, "size": 3, "word": "salut", "rank": 0}, task_id
    config_maps = [body for body in real_double.created if body.get("kind") == "ConfigMap"]
    assert len(config_maps) == 2
    for body in config_maps:
        assert validate_object("configmaps", body) == []
        call = json.loads(body["data"][CALL_FILE])
        assert call["args"] == [1.5, "salut"] and call["kwargs"] == {}  # the template, rendered
        assert call["source"].startswith("def k8s_allreduce(") and "@task" not in call["source"]
        assert "def main()" in body["data"][RUNNER_FILE]
    assert job_objects(real_double) == []


def test_mapped_sweeps_run_one_job_per_map_index(dagbag: Any, real_double: KubeDouble) -> None:
    dag_run = dagbag.get_dag("mpi_test_mapped_k8s").test()
    instances = task_instances(dag_run)
    tasks = ("expand_job", "expand_kwargs", "k8s_sweep")
    assert set(instances) == {(task, index) for task in tasks for index in range(3)}
    assert all(state == "success" for state, _ in instances.values()), instances
    assert [instances[("expand_job", i)][1]["result"] for i in range(3)] == ["0", "1", "2"]
    assert [instances[("expand_kwargs", i)][1]["result"] for i in range(3)] == ["kw0", "kw1", "kw2"]
    sweep = [instances[("k8s_sweep", i)][1] for i in range(3)]
    assert [r["lr"] for r in sweep] == [0.1, 0.01, 0.001] and all(r["np"] == 2 for r in sweep)
    names = [v["job_name"] for (t, _), (_, v) in instances.items() if t != "k8s_sweep"] + [r["job"] for r in sweep]
    assert len(set(names)) == 9 and all(re.fullmatch(r"[a-z0-9-]+-[a-z2-7]{13}", n) for n in names), names
    services = [body for body in real_double.created if body.get("kind") == "Service"]
    labelled = {(b["metadata"]["labels"][LABEL_TASK_ID], b["metadata"]["labels"][LABEL_MAP_INDEX]) for b in services}
    assert labelled == {(task, str(index)) for task in tasks for index in range(3)}
    bodies = [body for body in real_double.created if body.get("kind") in PLURAL]
    assert len(bodies) == 9 * (3 + 2)  # Service, Secret, ConfigMap and 2 pods per job
    assert all(validate_object(PLURAL[body["kind"]], body) == [] for body in bodies)
    assert job_objects(real_double) == []


@pytest.mark.slow
def test_taskflow_example_on_kubernetes(dagbag: Any, real_double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    install_connections(monkeypatch, real_double, mpi_conn_id="mpi_default")
    dag_run = dagbag.get_dag("mpi_training_taskflow").test()
    assert task_states(dag_run) == {"preprocess": "success", "train": "success", "evaluate": "success"}
    assert xcom(dag_run, "evaluate") >= 0.85
    assert xcom(dag_run, "train")["world_size"] == 3
    assert real_double.request_count("POST", "/pods") == 3
    assert job_objects(real_double) == []


def test_an_oversize_argument_creates_nothing(
    dagbag: Any, double: KubeDouble, connections: None, capfd: pytest.CaptureFixture[str]
) -> None:
    dag_run = dagbag.get_dag("mpi_test_taskflow_k8s_too_big").test()
    assert task_states(dag_run) == {"k8s_too_big": "failed"}
    assert "argument blob 1200002 bytes" in capfd.readouterr().out
    assert double.created == []  # refused before the first request
