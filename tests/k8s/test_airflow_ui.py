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
from airflow_mpi.operators.xcomkeys import JOB_LINK, JOB_REF, JOB_SUMMARY
from tests.airflow_helpers import api_client, extra_links
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, install_connections, job_objects

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
    refs = xcoms(dag_run, JOB_REF)
    links = xcoms(dag_run, JOB_LINK)  # what the UI's button opens
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
    assert set(xcoms(dag_run, JOB_LINK).values()) == {""}
    assert len(xcoms(dag_run, JOB_REF)) == 6


def test_decorated_tasks_link_to_their_jobs(dagbag: Any, double: KubeDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """@task.mpi, unmapped and mapped, waiting and deferred: the link resolved by Airflow's own
    machinery (its REST API's extra links, what the Details tab shows) opens each instance's job,
    and the job's summary keeps its own key."""
    install_connections(monkeypatch, double, job_url_template=TEMPLATE)
    dag_run = dagbag.get_dag("mpi_test_k8s_decorated_links").test()
    instances = {("waiting", -1), ("deferred", -1)} | {
        (f"{m}_mapped", i) for m in ("waiting", "deferred") for i in (0, 1)
    }
    client = api_client(monkeypatch)
    links = {i: extra_links(client, dag_run.dag_id, dag_run.run_id, *i)["MPI job"] for i in instances}
    assert all(links.values()) and len(set(links.values())) == 6, links  # a link per instance, each its own
    refs, summaries = xcoms(dag_run, JOB_REF), xcoms(dag_run, JOB_SUMMARY)
    assert set(refs) == set(summaries) == instances, (refs, summaries)
    for task_id, map_index in instances:
        job = summaries[(task_id, map_index)]["job_name"]
        assert refs[(task_id, map_index)] == {"job": job, "namespace": "default"}
        assert links[(task_id, map_index)] == (
            f"https://dash.example/default/{job}?dag=mpi_test_k8s_decorated_links&task={task_id}&try=1"
        )
    assert job_objects(double) == []


def test_the_link_is_there_while_the_job_runs(
    dagbag: Any, double: KubeDouble, scripts: Scripts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master of this job runs until Airflow's REST API (what the Details tab polls while the
    task runs) answers with the task's link, or 60 s have passed."""
    install_connections(monkeypatch, double, job_url_template=TEMPLATE)
    client = api_client(monkeypatch)
    dag_id = "mpi_test_k8s_link_while_running"
    seen: list[dict[str, Any]] = []

    def master_output() -> Any:
        yield "[1,0]<stdout>:training"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            runs = client.get(f"/api/v2/dags/{dag_id}/dagRuns", params={"state": "running"}).json()["dag_runs"]
            if runs:
                links = extra_links(client, dag_id, runs[0]["dag_run_id"], "train")
                if links.get("MPI job"):
                    seen.append(links)
                    break
            time.sleep(0.5)
        yield "[1,0]<stdout>:done"

    scripts.on("slow-", PodScript(lines=master_output, exit_code=0))
    scripts.on("-worker-", PodScript())  # checked first: the workers just run
    dag_run = dagbag.get_dag(dag_id).test()
    job = xcoms(dag_run, "return_value")[("train", -1)]["job_name"]
    expected = f"https://dash.example/default/{job}?dag={dag_id}&task=train&try=1"
    assert seen == [{"MPI job": expected}]  # while the task ran
    assert extra_links(client, dag_id, dag_run.run_id, "train") == {"MPI job": expected}  # and after
    assert job_objects(double) == []


def test_the_connection_form_offers_every_backend_the_hook_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The form's Backend field as Airflow's UI gets it: the hook's backends, its default
    preselected, and no empty ("null") choice."""
    from airflow_mpi.backends import DEFAULT_BACKEND
    from airflow_mpi.hooks.mpi import BACKENDS

    response = api_client(monkeypatch).get("/ui/connections/hook_meta")
    assert response.status_code == 200
    (meta,) = [m for m in response.json() if m["connection_type"] == "mpi"]
    backend = meta["extra_fields"]["backend"]
    assert backend["schema"]["enum"] == list(BACKENDS) == ["local", "kubernetes", "volcano", "mpijob", "trainjob"]
    assert backend["value"] == DEFAULT_BACKEND == "local"
    assert backend["schema"]["type"] == "string"  # no null, so no "null" option
    for kind in BACKENDS:
        assert f"'{kind}'" in backend["description"]


def test_a_connection_test_names_the_connection_as_the_user_knows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The UI's and the REST API's connection test run the hook on a copy with a generated id:
    the message says "this connection" and shows the whole template, however long."""
    template = "https://grafana.example.internal/explore?orgId=1&left=%5B%22now-1h%22%5D&namespace={ns}&job={job}"
    assert len(template) > 80
    response = api_client(monkeypatch).post(
        "/api/v2/connections/test",
        json={"connection_id": "my_mpi", "conn_type": "mpi", "extra": json.dumps({"job_url_template": template})},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["status"] is False
    assert answer["message"].startswith(
        f"this connection: extra 'job_url_template' {template!r} names the unknown field {{ns}}; use only the fields"
    ), answer["message"]


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
    assert not ok and message == str(raised.value).replace("connection 'mpi_k8s'", "this connection")
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
