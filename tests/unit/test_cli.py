"""`airflow-mpi render|validate`: no cluster needed, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from airflow_mpi.cli.main import main

SPEC = """
name: digits
image: registry.example/train:1
command: [python, /app/train.py]
workers: {replicas: 2, cpu: 2}
"""


def test_render_prints_a_yaml_stream_without_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.yaml").write_text(SPEC)
    assert main(["render", str(tmp_path / "job.yaml"), "--run-id", "r1", "--namespace", "ml"]) == 0
    out = capsys.readouterr().out
    objects = list(yaml.safe_load_all(out))
    assert [o["kind"] for o in objects] == ["Service", "Secret", "ConfigMap", "Pod", "Pod", "Pod"]
    assert all(o["metadata"]["namespace"] == "ml" for o in objects)
    assert "PRIVATE KEY" not in out
    assert out.splitlines()[1].startswith("#   mpiexec --allow-run-as-root --host ")


def test_render_is_deterministic_for_a_run_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.yaml").write_text(SPEC)
    names = []
    for run_id in ("r1", "r1", "r2"):
        main(["render", str(tmp_path / "job.yaml"), "--run-id", run_id])
        names.append(next(yaml.safe_load_all(capsys.readouterr().out))["metadata"]["name"])
    assert names[0] == names[1] != names[2]


def test_bad_spec_exits_2_naming_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("name: Bad\ncommand: [deepspeed, t.py]\nmaster: {replicas: 2}\n")
    assert main(["validate", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert "3 problems" in err and "master.replicas" in err and "command" in err and "name" in err


def test_validate_prints_hosts_and_np(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.yaml").write_text(SPEC)
    assert main(["validate", str(tmp_path / "job.yaml")]) == 0
    assert "MPI_NP=5 on 3 pod(s)" in capsys.readouterr().out


def test_render_for_the_volcano_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.yaml").write_text(SPEC + "scheduling: {queue: training}\n")
    assert main(["render", str(tmp_path / "job.yaml"), "--backend", "volcano", "--namespace", "ml"]) == 0
    out = capsys.readouterr().out
    objects = list(yaml.safe_load_all(out))
    assert [(o["apiVersion"], o["kind"]) for o in objects] == [
        ("batch.volcano.sh/v1alpha1", "Job"),
        ("v1", "Secret"),
        ("v1", "ConfigMap"),
    ]
    assert objects[0]["spec"]["queue"] == "training" and "PRIVATE KEY" not in out


def test_render_for_the_mpijob_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job.yaml").write_text(SPEC + "scheduling: {queue: training}\n")
    assert main(["render", str(tmp_path / "job.yaml"), "--backend", "mpijob", "--namespace", "ml"]) == 0
    out = capsys.readouterr().out
    objects = list(yaml.safe_load_all(out))
    assert [(o["apiVersion"], o["kind"]) for o in objects] == [
        ("kubeflow.org/v2beta1", "MPIJob"),
        ("v1", "Secret"),
        ("v1", "ConfigMap"),
    ]
    job = objects[0]["metadata"]["name"]
    assert objects[0]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
    assert objects[1]["metadata"]["name"] == f"{job}-airflow-ssh" and "PRIVATE KEY" not in out
    assert "/etc/airflow-mpi/config/launch.sh rank" in out.splitlines()[1]  # the launcher's command line


def test_render_with_a_gang_setting_prints_the_pod_group_and_the_master_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(SPEC + "scheduling: {gang: volcano}\n")
    assert main(["render", str(tmp_path / "job.yaml"), "--backend", "kubernetes"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["kind"] for o in objects] == ["Service", "Secret", "ConfigMap", "PodGroup", "Pod", "Pod", "Pod"]
    assert objects[4]["metadata"]["name"].endswith("-master-0")


def test_render_refuses_a_gang_the_volcano_backend_cannot_honour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(SPEC + "scheduling: {gang: kueue, queue: q}\n")
    assert main(["render", str(tmp_path / "job.yaml"), "--backend", "volcano"]) == 2
    assert "scheduling.gang" in capsys.readouterr().err


def test_each_run_invocation_has_a_run_id_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ``airflow-mpi run`` of one spec at once are two jobs; ``--run-id`` still names one."""
    from airflow_mpi.cli import main as cli

    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"name": "twice", "command": ["python", "t.py"]}))
    identities = []
    monkeypatch.setattr(cli, "run_job_from_cli", lambda spec, identity, **_: identities.append(identity) or 0)
    assert main(["run", str(tmp_path / "job.yaml")]) == 0
    assert main(["run", str(tmp_path / "job.yaml")]) == 0
    assert main(["run", str(tmp_path / "job.yaml"), "--run-id", "r1"]) == 0
    first, second, named = identities
    assert first.run_id != second.run_id and first.run_id.startswith("cli__") and named.run_id == "r1"
    assert cli.invocation_run_id(0.0, "ab12") == "cli__1970-01-01T00-00-00_ab12"
