"""XCom keys are one namespace per task instance: each feature's key is its own."""

from __future__ import annotations

from airflow_mpi.backends import BACKEND_NAMES, DEFAULT_BACKEND
from airflow_mpi.get_provider_info import get_provider_info
from airflow_mpi.hooks.mpi import BACKENDS
from airflow_mpi.operators import xcomkeys
from airflow_mpi.operators.links import MPIJobLink


def test_every_key_is_distinct_and_listed() -> None:
    named = {v for k, v in vars(xcomkeys).items() if k.isupper() and isinstance(v, str)}
    assert set(xcomkeys.KEYS) == named
    assert len(xcomkeys.KEYS) == len(set(xcomkeys.KEYS))


def test_the_decorators_summary_and_the_links_reference_have_their_own_keys() -> None:
    from airflow_mpi.decorators import mpi as decorator

    assert decorator.JOB_SUMMARY == xcomkeys.JOB_SUMMARY != xcomkeys.JOB_REF
    assert MPIJobLink().xcom_key == xcomkeys.JOB_LINK  # where Airflow stores the link the UI shows


def test_the_form_offers_the_backends_the_hook_accepts() -> None:
    (connection,) = get_provider_info()["connection-types"]
    schema = connection["conn-fields"]["backend"]["schema"]
    assert schema["enum"] == list(BACKENDS) == list(BACKEND_NAMES)
    assert schema["default"] == DEFAULT_BACKEND and None not in schema["enum"]
