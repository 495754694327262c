"""The ``mpi`` connection's form: its fields and the standard fields it hides, in one place.

Airflow 3.2 and later read them declaratively from the provider info (``conn-fields``,
``ui-field-behaviour``: ``get_provider_info``); Airflow 3.0 and 3.1 only from the hook's
``get_connection_form_widgets`` and ``get_ui_field_behaviour`` (built here from the same data;
3.2+ skips those once the provider info has the fields).
"""

from __future__ import annotations

from typing import Any

from airflow_mpi.backends import BACKEND_NAMES, DEFAULT_BACKEND, describe_backends

HIDDEN_FIELDS = ["host", "schema", "login", "password", "port", "extra"]
EXTRA_PREFIX = "extra__mpi__"  # how Airflow 3.0 and 3.1 may name a form field in the extras

CONN_FIELDS: dict[str, dict[str, Any]] = {
    "backend": {
        "label": "Backend",
        "description": describe_backends(),
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
    "nccl_ib_env": {
        "label": "NCCL_IB_* for every pod",
        "description": "JSON object of the NCCL_IB_* variables this cluster's InfiniBand needs, written into every "
        'pod (a job spec may not set them), e.g. {"NCCL_IB_HCA": "mlx5"}',
        "schema": {"type": ["object", "null"]},
    },
    "state_dir": {
        "label": "Local state directory",
        "description": "Where the local backend keeps its job files (default /run/airflow-mpi-local)",
        "schema": {"type": ["string", "null"]},
    },
}


def build_form_widgets() -> dict[str, Any]:
    """The fields as Airflow 3.0 and 3.1's connection form takes them (WTForms string fields;
    their UI reads label and description). Needs WTForms and Flask-AppBuilder, as every
    provider's form does on those releases (without them Airflow shows the extras as JSON)."""
    from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
    from flask_babel import lazy_gettext
    from wtforms import StringField

    return {
        name: StringField(lazy_gettext(field["label"]), widget=BS3TextFieldWidget(), description=field["description"])
        for name, field in CONN_FIELDS.items()
    }


def unprefixed(extras: dict[str, Any]) -> dict[str, Any]:
    """Extras as the hook reads them: a form field saved as ``extra__mpi__<name>`` (Airflow 3.0
    and 3.1's form) under ``<name>``, unless that is set too."""
    found = {key[len(EXTRA_PREFIX) :]: value for key, value in extras.items() if key.startswith(EXTRA_PREFIX)}
    plain = {key: value for key, value in extras.items() if not key.startswith(EXTRA_PREFIX)}
    return {**{key: value for key, value in found.items() if value not in (None, "")}, **plain}
