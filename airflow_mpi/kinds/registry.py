"""The registry of job kinds: every way a job's pods come to exist on Kubernetes, by name.

A kind's behaviour is its ``JobKind`` class; this table only names it, so that what offers the
kinds (the ``mpi`` connection's form, the CLI's choices, the provider info) reads it without
importing any kind. A new kind is its module and one line here.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    KindEntry("pods", "kubernetes", "pods", "airflow_mpi.kinds.strategy:JobKind"),
    KindEntry("volcano", "volcano", "a Volcano Job", "airflow_mpi.kinds.volcano:VolcanoKind"),
    KindEntry("mpijob", "mpijob", "a Kubeflow MPIJob, run by mpi-operator", "airflow_mpi.kinds.mpijob:MPIJobKind"),
    KindEntry("trainjob", "trainjob", "a Kubeflow Trainer v2 TrainJob", "airflow_mpi.kinds.trainjob:TrainJobKind"),
)
KIND_OF_BACKEND = {entry.backend: entry.name for entry in KIND_ENTRIES}
BACKEND_OF_KIND = {entry.name: entry.backend for entry in KIND_ENTRIES}
