"""Key hygiene on the Kubernetes backend (the API double): the job's private keys live only in its
Secret; no line of them reaches the task log, the operator's log records, XCom, a failed job's
exception or `airflow-mpi render`; each pod mounts only its own host key, read-only, 0400."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.contract import SSH_HOST_KEY, host_key_file
from airflow_mpi.exceptions import JobFailed
from tests.airflow_helpers import task_states, xcom
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.k8s.conftest import Scripts, job_objects
from tests.keyscan import exception_texts, execute, log_texts, recording_keys, render_outputs

pytestmark = pytest.mark.usefixtures("connections")

SPEC: dict[str, Any] = {
    "name": "hygiene",
    "image": "registry.example/train:1",
    "command": ["python", "/app/train.py", "$(id)", "a b"],
    "workers": {"replicas": 2},
    "startup_timeout": 30,
}
RESULT_LINE = '[1,0]<stdout>:AIRFLOW_MPI_RESULT {"loss": 0.1}'


def created_texts(double: KubeDouble) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """Every object the backend sent, but the Secrets (whose job is to hold the keys), as text."""
    bodies = [b for b in double.created if b.get("kind") != "Secret"]
    secrets = [b for b in double.created if b.get("kind") == "Secret"]
    return [(f"{b['kind']} {b['metadata']['name']}", json.dumps(b)) for b in bodies], secrets


def test_keys_only_in_the_secret_and_each_pod_mounts_its_own_host_key(
    double: KubeDouble,
    scripts: Scripts,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    scripts.on("-master-", PodScript(lines=lambda: iter(["[1,0]<stdout>:training", RESULT_LINE]), exit_code=0))
    with recording_keys(monkeypatch) as keys:
        result = execute(SPEC, "mpi_k8s")
        texts = log_texts(capfd, caplog) + render_outputs(SPEC, tmp_path, capfd)
    others, secrets = created_texts(double)
    texts += [("XCom", json.dumps(result)), *others]
    assert result["result"] == {"loss": 0.1}
    assert keys.leaks(texts) == []

    [secret] = secrets  # where the keys are meant to be: proves the scan looks for the right text
    stored = "".join(secret["data"].values()) + "".join(base64.b64decode(v).decode() for v in secret["data"].values())
    assert keys.leaks([("Secret", stored)]) != []
    pods = [b for b in double.created if b.get("kind") == "Pod"]
    assert len(pods) == 3
    for pod in pods:
        [volume] = [v for v in pod["spec"]["volumes"] if "secret" in v]
        host_keys = [item for item in volume["secret"]["items"] if item["path"] == SSH_HOST_KEY]
        assert host_keys == [{"key": host_key_file(pod["metadata"]["name"]), "path": SSH_HOST_KEY}]
        assert volume["secret"]["defaultMode"] == 0o400
        [mount] = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
    assert job_objects(double) == []


def test_a_failed_job_leaks_no_key(
    double: KubeDouble,
    scripts: Scripts,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    failing = ["[1,1]<stderr>:Traceback (most recent call last):", "[1,1]<stderr>:ValueError: bad batch"]
    scripts.on("-master-", PodScript(lines=lambda: iter(failing), exit_code=1))
    with recording_keys(monkeypatch) as keys, pytest.raises(JobFailed) as caught:
        execute(SPEC, "mpi_k8s")
    texts = log_texts(capfd, caplog) + exception_texts(caught.value) + created_texts(double)[0]
    assert keys.leaks(texts) == []
    assert "ValueError: bad batch" in str(caught.value)
    assert job_objects(double) == []


def test_a_deferred_job_leaks_no_key(
    dagbag: Any,
    double: KubeDouble,
    scripts: Scripts,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    scripts.on("-master-", PodScript(lines=lambda: iter([RESULT_LINE]), exit_code=0))
    with recording_keys(monkeypatch) as keys:
        dag_run = dagbag.get_dag("mpi_test_k8s_deferred").test()
    assert task_states(dag_run) == {"train": "success"}
    texts = [*log_texts(capfd, caplog), ("XCom", json.dumps(xcom(dag_run, "train"))), *created_texts(double)[0]]
    assert keys.materials and keys.leaks(texts) == []
    assert job_objects(double) == []
