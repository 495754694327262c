"""Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from airflow_mpi import __version__
from airflow_mpi.backends import BACKEND_NAMES, DEFAULT_BACKEND


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
                "conn-fields": {
                    "backend": {
                        "label": "Backend",
                        "description": "'local' (namespaced processes on this machine), 'kubernetes' (pods), "
                        "'volcano' (a Volcano Job) or 'mpijob' (a Kubeflow MPIJob, run by mpi-operator)",
                        # The hook's names and default: the form preselects the default and
                        # offers no empty choice (the hook treats an unset backend as the default).
                        "schema": {"type": "string", "enum": list(BACKEND_NAMES), "default": DEFAULT_BACKEND},
                    },
                    "kubernetes_conn_id": {
                        "label": "Kubernetes connection id",
                        "description": "Airflow connection of the cluster (kubernetes backend)",
                        "schema": {"type": ["string", "null"]},
                    },
                    "namespace": {
                        "label": "Namespace",
                        "description": "Namespace for the job's objects (default: the Kubernetes connection's)",
                        "schema": {"type": ["string", "null"]},
                    },
                    "api_timeout": {
                        "label": "API timeout (seconds)",
                        "description": "Seconds the Kubernetes API may stay silent before a wait gives up (120)",
                        "schema": {"type": ["number", "null"], "minimum": 1, "maximum": 86400},
                    },
                    "job_url_template": {
                        "label": "Job link URL template",
                        "description": "The task's 'MPI job' link, e.g. https://dash.example/{namespace}/{job}; "
                        "fields: "
                        "{namespace}, {job}, {dag_id}, {task_id}, {run_id}, {try_number}",
                        "schema": {"type": ["string", "null"]},
                    },
                    "state_dir": {
                        "label": "Local state directory",
                        "description": "Where the local backend keeps its job files (default /run/airflow-mpi-local)",
                        "schema": {"type": ["string", "null"]},
                    },
                },
                "ui-field-behaviour": {"hidden-fields": ["host", "schema", "login", "password", "port", "extra"]},
            }
        ],
    }
