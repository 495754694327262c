"""A job kind's knowledge stays in ``kinds/``: nothing else branches on a kind's name or reads
its flags, as the import contract keeps the layers.

The names a caller offers (the connection form, the CLI's choices, ``render``) come from the
registry; a caller asks a kind a question (``controller_makes_pods``) instead of working out
the answer from its flags, and never reads a hook only a kind fills in (``_rules``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import airflow_mpi
from airflow_mpi.backends import BACKEND_NAMES, BACKEND_SUMMARIES, KUBERNETES_KINDS, describe_backends
from airflow_mpi.hooks.connection_form import CONN_FIELDS
from airflow_mpi.kinds.registry import KIND_ENTRIES, job_kind, kind_for_backend, kind_of, registered_kinds

PACKAGE = Path(airflow_mpi.__file__).parent
NAMES = {entry.name for entry in KIND_ENTRIES} | {entry.backend for entry in KIND_ENTRIES}


def _outside_kinds() -> list[tuple[str, ast.AST]]:
    trees = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith("kinds/"):
            trees.append((relative, ast.parse(path.read_text())))
    return trees


def _compared_names(node: ast.Compare) -> set[str]:
    found: set[str] = set()
    for operand in (node.left, *node.comparators):
        values = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
        found |= {v.value for v in values if isinstance(v, ast.Constant) and v.value in NAMES}
    return found


def test_no_code_outside_kinds_compares_with_a_kinds_name() -> None:
    found = [
        f"{path}:{node.lineno} compares with {sorted(_compared_names(node))}"
        for path, tree in _outside_kinds()
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and _compared_names(node)
    ]
    assert found == [], "ask the kind (kinds/base.py) instead of testing its name:\n" + "\n".join(found)


def test_no_code_outside_kinds_reads_a_kinds_hooks() -> None:
    reads = [
        f"{path}:{node.lineno} reads {ast.unparse(node)}"
        for path, tree in _outside_kinds()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and "kind" in ast.unparse(node.value)
    ]
    assert reads == [], "make it a question the kind answers (a JobKind method):\n" + "\n".join(reads)


def test_the_registry_names_every_kind_and_backend_once() -> None:
    kinds = registered_kinds()
    assert list(kinds) == [entry.name for entry in KIND_ENTRIES]
    assert all(kinds[entry.name].name == entry.name for entry in KIND_ENTRIES)
    assert ("local", *KUBERNETES_KINDS) == BACKEND_NAMES and len(set(BACKEND_NAMES)) == len(BACKEND_NAMES)
    for entry in KIND_ENTRIES:
        assert kind_for_backend(entry.backend) is job_kind(entry.name)
        assert f"{entry.backend!r} ({entry.summary})" in describe_backends()
    assert CONN_FIELDS["backend"]["schema"]["enum"] == list(BACKEND_NAMES) == list(BACKEND_SUMMARIES)
    assert CONN_FIELDS["backend"]["description"] == describe_backends()


def test_an_unknown_kind_or_backend_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown job kind 'jobset': one of pods, volcano, mpijob, trainjob"):
        job_kind("jobset")
    with pytest.raises(
        ValueError, match=r"unknown Kubernetes backend 'pods': one of kubernetes, volcano, mpijob, trainjob"
    ):
        kind_for_backend("pods")


def test_an_objects_kind_is_told_by_its_owner_most_specific_first() -> None:
    def owned_by(api_version: str, kind: str, **labels: str) -> dict[str, object]:
        return {"metadata": {"ownerReferences": [{"apiVersion": api_version, "kind": kind}], "labels": labels}}

    assert kind_of(owned_by("v1", "Service")).name == "pods"
    assert kind_of(owned_by("batch.volcano.sh/v1alpha1", "Job")).name == "volcano"
    assert kind_of(owned_by("kubeflow.org/v2beta1", "MPIJob")).name == "mpijob"
    launcher = {"training.kubeflow.org/job-name": "j"}  # mpi-operator's label on the launcher pod
    assert kind_of(owned_by("batch/v1", "Job", **launcher)).name == "mpijob"
    assert kind_of(owned_by("trainer.kubeflow.org/v1alpha1", "TrainJob")).name == "trainjob"
    jobset_pod = {"jobset.sigs.k8s.io/jobset-name": "j"}  # a TrainJob's pods are its JobSet's Jobs'
    assert kind_of(owned_by("batch/v1", "Job", **jobset_pod)).name == "trainjob"
    assert kind_of(owned_by("batch/v1", "Job")).name == "pods"  # another controller's Job: neither's
