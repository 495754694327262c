"""The registry of job kinds: every way a job's pods come to exist on Kubernetes, by name.

A kind's behaviour is its ``JobKind`` class (``kinds.base``); this table only names it, so that
what offers the kinds (the ``mpi`` connection's form, the CLI's choices, the provider info) reads
it without importing any kind: the lookups below import a kind's module on first use. A new
kind is its module and one line here.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_mpi.kinds.base import JobKind


@dataclass(frozen=True)
class KindEntry:
    """One kind: ``name`` (how the trigger and the cluster CLI name it), ``backend`` (the ``mpi``
    connection's backend that runs it), ``summary`` (what the form and the CLI say it is),
    ``path`` (``module:Class`` of its ``JobKind``)."""

    name: str
    backend: str
    summary: str
    path: str


# In the order the connection form and the CLI offer them.
KIND_ENTRIES = (
    KindEntry("pods", "kubernetes", "pods", "airflow_mpi.kinds.pods:PodsKind"),
    KindEntry("volcano", "volcano", "a Volcano Job", "airflow_mpi.kinds.volcano:VolcanoKind"),
    KindEntry("mpijob", "mpijob", "a Kubeflow MPIJob, run by mpi-operator", "airflow_mpi.kinds.mpijob:MPIJobKind"),
    KindEntry("trainjob", "trainjob", "a Kubeflow Trainer v2 TrainJob", "airflow_mpi.kinds.trainjob:TrainJobKind"),
)
KIND_OF_BACKEND = {entry.backend: entry.name for entry in KIND_ENTRIES}
BACKEND_OF_KIND = {entry.name: entry.backend for entry in KIND_ENTRIES}


@functools.cache
def registered_kinds() -> dict[str, JobKind]:
    """Every kind, by name, in the table's order."""
    kinds: dict[str, JobKind] = {}
    for entry in KIND_ENTRIES:
        module, _, cls = entry.path.partition(":")
        kind = getattr(importlib.import_module(module), cls)()
        if kind.name != entry.name:
            raise TypeError(f"{entry.path} is kind {kind.name!r}, registered as {entry.name!r}")
        kinds[entry.name] = kind
    return kinds


def job_kind(name: str) -> JobKind:
    """The kind named ``name`` (``pods``, ``volcano``, ``mpijob``, ``trainjob``)."""
    kinds = registered_kinds()
    try:
        return kinds[name]
    except KeyError:
        raise ValueError(f"unknown job kind {name!r}: one of {', '.join(kinds)}") from None


def kind_for_backend(backend: str) -> JobKind:
    """The kind an ``mpi`` connection's Kubernetes ``backend`` runs (``kubernetes``: plain pods)."""
    try:
        return job_kind(KIND_OF_BACKEND[backend])
    except KeyError:
        raise ValueError(f"unknown Kubernetes backend {backend!r}: one of {', '.join(KIND_OF_BACKEND)}") from None


def kind_of(obj: dict[str, Any]) -> JobKind:
    """The kind of the job ``obj`` (our Secret, a pod) belongs to, by its owner: the kinds a
    controller runs first, then the one whose objects a Service owns."""
    kinds = sorted(registered_kinds().values(), key=lambda kind: not kind.controller_makes_pods())
    return next((kind for kind in kinds if kind.owns(obj)), kinds[-1])
