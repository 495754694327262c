"""Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from airflow_mpi import __version__
from airflow_mpi.hooks.connection_form import CONN_FIELDS, HIDDEN_FIELDS


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-mpi",
        "name": "MPI jobs",
        "description": "Run MPI training jobs (DeepSpeed, Horovod, mpi4py) as one master pod plus N worker "
        "pods, on Kubernetes or on an embedded local backend.",
        "versions": [__version__],
        "operators": [{"integration-name": "MPI", "python-modules": ["airflow_mpi.operators.mpi"]}],
        "sensors": [{"integration-name": "MPI", "python-modules": ["airflow_mpi.sensors.sshd"]}],
        "hooks": [{"integration-name": "MPI", "python-modules": ["airflow_mpi.hooks.mpi"]}],
        "extra-links": ["airflow_mpi.operators.links.MPIJobLink"],
        "triggers": [{"integration-name": "MPI", "python-modules": ["airflow_mpi.triggers.mpi"]}],
        "task-decorators": [{"name": "mpi", "class-name": "airflow_mpi.decorators.mpi.mpi_task"}],
        "integrations": [
            {
                "integration-name": "MPI",
                "external-doc-url": "https://www.open-mpi.org/doc/",
                "tags": ["software"],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_mpi.hooks.mpi.MPIJobHook",
                "hook-name": "MPI job backend",
                "connection-type": "mpi",
                "conn-fields": CONN_FIELDS,
                "ui-field-behaviour": {"hidden-fields": HIDDEN_FIELDS},
            }
        ],
    }
