"""Provider metadata: passes Airflow's schema, and Airflow finds the provider through its entry point."""

from __future__ import annotations

import json
from pathlib import Path

import airflow
import jsonschema

from airflow_mpi.get_provider_info import get_provider_info


def test_provider_info_passes_airflow_schema() -> None:
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "airflow-mpi"
    assert info["connection-types"][0]["connection-type"] == "mpi"


def test_airflow_lists_the_provider() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert "airflow-mpi" in manager.providers
    hooks = manager.hooks
    assert "mpi" in hooks and hooks["mpi"].hook_class_name == "airflow_mpi.hooks.mpi.MPIJobHook"
