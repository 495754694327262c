"""What the Airflow UI shows of an MPI task: the "MPI job" link (through real ``dag.test()`` runs,
waiting, deferred and mapped, on the API double), and ``airflow connections test`` on the
Kubernetes backend saying what failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from airflow_mpi.exceptions import BackendUnavailable
from airflow_mpi.hooks.mpi import MPIJobHook
from airflow_mpi.joblink import LINK_XCOM_KEY
from airflow_mpi.testing.kube_double import KubeDouble
from tests.k8s.conftest import install_connections, job_objects

TEMPLATE = "https://dash.example/{namespace}/{job}?dag={dag_id}&task={task_id}&try={try_number}"


def xcoms(dag_run: Any, key: str) -> dict[tuple[str, int], Any]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, key=key)).all()
        return {(row.task_id, row.map_index): row.value for row in rows}


def test_every_task_instance_links_to_its_own_job(
    dagbag: Any, double: KubeDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_connections(monkeypatch, double, job_url_template=TEMPLATE)
    dag_run = dagbag.get_dag("mpi_test_k8s_mapped").test()
    results = xcoms(dag_run, "return_value")
    refs = xcoms(dag_run, LINK_XCOM_KEY)
    links = xcoms(dag_run, "_link_MPIJobLink")  # what the UI's button opens
    assert len(results) == 6 and set(refs) == set(results) == set(links)
    for (task_id, map_index), result in results.items():
        job = result["job_name"]
        assert refs[(task_id, map_index)] == {"job": job, "namespace": "default"}  # names only, no keys
        assert links[(task_id, map_index)] == (
            f"https://dash.example/default/{job}?dag=mpi_test_k8s_mapped&task={task_id}&try=1"
        )
    assert len(set(links.values())) == 6
    assert job_objects(double) == []


def test_without_a_template_there_is_no_link(dagbag: Any, double: KubeDouble, connections: None) -> None:
    dag_run = dagbag.get_dag("mpi_test_k8s_mapped").test()
    assert set(xcoms(dag_run, "_link_MPIJobLink").values()) == {""}
    assert len(xcoms(dag_run, LINK_XCOM_KEY)) == 6


def test_a_template_with_an_unknown_field_fails_when_the_connection_is_read(
    double: KubeDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_connections(monkeypatch, double, job_url_template="https://dash.example/{ns}/{job}")
    with pytest.raises(BackendUnavailable) as raised:
        MPIJobHook("mpi_k8s").get_backend()
    assert str(raised.value).startswith(
        "connection 'mpi_k8s': extra 'job_url_template' 'https://dash.example/{ns}/{job}' names the unknown field {ns}"
    )
    ok, message = MPIJobHook("mpi_k8s").test_connection()
    assert not ok and message == str(raised.value)
    assert double.request_count() == 0


def test_connection_test_lists_pods_and_says_what_failed(double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    install_connections(monkeypatch, double)
    hook = MPIJobHook("mpi_k8s")
    assert hook.test_connection() == (
        True,
        f"the Kubernetes API at {double.url} lists pods in namespace default (no pods yet)",
    )
    assert double.request_count("GET", "/api/v1/namespaces/default/pods") == 1

    double.expire_credentials()
    ok, message = hook.test_connection()
    assert not ok and "refused the credentials (401 Unauthorized) while listing pods in namespace default" in message
    double.expire_credentials(False)

    install_connections(monkeypatch, double, namespace="nosuch")
    ok, message = MPIJobHook("mpi_k8s").test_connection()
    assert not ok and message.startswith("namespace nosuch does not exist (404 NotFound")

    install_connections(monkeypatch, double)
    double.deny("list", "pods")
    ok, message = hook.test_connection()
    assert not ok and "cannot `list` `pods` in namespace default (403 Forbidden)" in message
    assert "the service account airflow/airflow-worker" in message and "add `list` on `pods` to the Role" in message

    double.refuse_connections()
    started = time.monotonic()
    ok, message = MPIJobHook("mpi_k8s").test_connection()
    assert not ok and message == (
        f"cannot reach the Kubernetes API at {double.url} (connection refused): check the server address"
    )
    assert time.monotonic() - started < 15  # no retries: a connection test answers at once
    double.accept_connections()


@pytest.mark.parametrize("deny", [False, True], ids=["success", "forbidden"])
def test_airflow_connections_test_command(double: KubeDouble, monkeypatch: pytest.MonkeyPatch, deny: bool) -> None:
    install_connections(monkeypatch, double)
    if deny:
        double.deny("list", "pods")
    env = {**os.environ, "AIRFLOW__CORE__TEST_CONNECTION": "Enabled"}
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "connections", "test", "mpi_k8s"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    if deny:
        assert done.returncode == 1 and "Connection failed!" in output
        assert "cannot `list` `pods` in namespace default (403 Forbidden)" in " ".join(output.split())
    else:
        assert done.returncode == 0 and "Connection success!" in output, output
    assert double.request_count("GET", "/api/v1/namespaces/default/pods") == 1


def test_the_connection_form_has_a_field_for_every_extra_the_hook_reads() -> None:
    import re
    from pathlib import Path

    from airflow.providers_manager import ProvidersManager

    import airflow_mpi.hooks.mpi as hook_module

    source = Path(hook_module.__file__).read_text()
    read = set(re.findall(r'extras\.get\("([a-z_]+)"', source)) | set(re.findall(r'extras, "([a-z_]+)"', source))
    read.add("job_url_template")  # read through joblink.URL_TEMPLATE_EXTRA
    assert read >= {"backend", "kubernetes_conn_id", "namespace", "api_timeout", "state_dir"}
    widgets = ProvidersManager().connection_form_widgets
    shown = {name.rsplit("__", 1)[-1] for name in widgets if name.startswith("extra__mpi__")}
    assert read <= shown, read - shown
    info = json.dumps(widgets["extra__mpi__job_url_template"].field["description"])
    assert "{namespace}" in info and "{job}" in info
