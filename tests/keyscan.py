"""Key hygiene checks shared by both backends' tests: record the ssh keys a job generates, and
find any line of them (as text or base64, as a Secret holds it) in what the job produced."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_mpi.cli.main import main
from airflow_mpi.job import plan as plan_module
from airflow_mpi.job.ssh import SshMaterial


class KeyRecorder:
    """Every SshMaterial ``render_plan`` generated while recording (the operator renders its own)."""

    def __init__(self) -> None:
        self.materials: list[SshMaterial] = []

    @property
    def private_keys(self) -> list[str]:
        keys = []
        for material in self.materials:
            keys.append(material.client.private_openssh)
            keys += [pair.private_openssh for pair in material.host_keys.values()]
        return keys

    def secret_fragments(self) -> set[str]:
        """What must never appear: every body line of every private key, and 40-character
        pieces of each key's base64 (how a Secret's data holds it)."""
        fragments = set()
        for key in self.private_keys:
            fragments |= {line for line in key.splitlines() if line and not line.startswith("-----")}
            encoded = base64.b64encode(key.encode()).decode()
            fragments |= {encoded[i : i + 40] for i in range(0, len(encoded) - 40, 40)}
        assert fragments, "no key was generated: the scan would prove nothing"
        return fragments

    def leaks(self, texts: Iterable[tuple[str, str]]) -> list[str]:
        """(where, fragment) for every fragment found in the texts."""
        fragments = self.secret_fragments()
        return [f"{where}: {fragment[:16]}..." for where, text in texts for fragment in fragments if fragment in text]


@contextmanager
def recording_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[KeyRecorder]:
    recorder = KeyRecorder()
    original = plan_module.build_ssh_material

    def build(job_name: str, pod_names: tuple[str, ...]) -> SshMaterial:
        material = original(job_name, pod_names)
        recorder.materials.append(material)
        return material

    monkeypatch.setattr(plan_module, "build_ssh_material", build)
    yield recorder


def log_texts(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """The task log as a test sees it: stdout/stderr and every log record (message and args)."""
    out, err = capfd.readouterr()
    records = "\n".join(f"{r.name} {r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records)
    return [("stdout", out), ("stderr", err), ("log records", records)]


def exception_texts(error: BaseException) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = [("exception", f"{error!s} {error!r}")]
    for name in ("tail", "problems", "causes"):
        value: Any = getattr(error, name, None)
        if value:
            parts.append((f"exception.{name}", repr(value)))
    if error.__cause__ is not None:
        parts += exception_texts(error.__cause__)
    return parts


def execute(spec: dict[str, Any], mpi_conn_id: str = "mpi_default") -> dict[str, Any]:
    """Run the operator's execute() as a worker would, with a unique run id (no DAG needed)."""
    from airflow_mpi.operators.mpi import MPIJobOperator

    operator = MPIJobOperator(task_id="train", job=spec, mpi_conn_id=mpi_conn_id)
    ti = SimpleNamespace(dag_id="hygiene", task_id="train", run_id=f"r-{time.time_ns()}", map_index=0, try_number=1)
    return operator.execute({"ti": ti})  # type: ignore[arg-type]


def render_outputs(spec: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> list[tuple[str, str]]:
    """What `airflow-mpi render` prints for the spec, as YAML and as JSON."""
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    texts = []
    for extra in ([], ["--json"]):
        assert main(["render", str(path), *extra]) == 0
        texts.append((f"render {' '.join(extra)}", capfd.readouterr().out))
    return texts
