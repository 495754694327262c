"""The documentation site: ``mkdocs build --strict`` passes (any warning, a broken internal link
or anchor, a page left out of the navigation fails it), the generated reference holds every spec
field, connection field, command and diagnosed cause, and the README's DAG is a DAG."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_mpi.get_provider_info import get_provider_info
from airflow_mpi.observe.diagnosis import KNOWN_FAILURES

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "docs"))
import hooks  # noqa: E402  (docs/hooks.py: the generators the build runs)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def page_text(site: Path, page: str) -> str:
    """A built page's text, tags stripped."""
    raw = (site / page / "index.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", " ", raw))


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    for page in ("getting-started", "guides/rbac", "guides/image", "reference/spec", "contract", "figures"):
        assert (site / page / "index.html").is_file(), page


def test_the_spec_reference_has_every_field_with_its_default_and_rules(site: Path) -> None:
    text = page_text(site, "reference/spec")
    for path, cls in hooks.spec_sections():
        docs = hooks.attribute_docs(cls)
        for field in dataclasses.fields(cls):
            assert docs.get(field.name), f"{cls.__name__}.{field.name} has no docstring for the reference"
            assert f"{field.name}" in text, (path, field.name)
    # The rules are the validator's own answers, e.g. for a port out of range:
    assert "use a TCP port 1-65535" in text
    assert "set master.replicas to 1" in text


def test_a_new_field_without_a_docstring_is_caught() -> None:
    @dataclasses.dataclass
    class Example:
        documented: int = 1
        """What it is."""
        bare: int = 2

    assert hooks.attribute_docs(Example) == {"documented": "What it is."}


def test_the_connection_cli_and_failure_references_are_complete(site: Path) -> None:
    connection = page_text(site, "reference/connection")
    (conn_type,) = get_provider_info()["connection-types"]
    for name, field in conn_type["conn-fields"].items():
        assert name in connection and field["label"] in connection, name
    cli = page_text(site, "reference/cli")
    for command in ("render", "validate", "run", "doctor", "jobs", "logs", "delete", "gc"):
        assert f"airflow-mpi {command}" in cli, command
    assert "--show-secrets" in cli and "--kubernetes-conn-id" in cli
    failures = page_text(site, "reference/failures")
    for failure in KNOWN_FAILURES:
        assert failure.summary in failures, failure.cause


def test_the_readme_dag_is_a_dag(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    (tmp_path / "readme_dag.py").write_text(code)
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(tmp_path))
    assert bag.import_errors == {}
    dag = bag.dags.get("digits")
    assert dag is not None and set(dag.task_ids) == {"preprocess", "train", "evaluate"}
    assert dag.get_task("train").upstream_task_ids == {"preprocess"}
