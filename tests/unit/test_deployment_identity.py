"""The deployment an operator's jobs carry, read from Airflow's configuration where the task runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_mpi.compat import AirflowFailException
from airflow_mpi.operators.mpi import deployment_identity, run_identity


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("AIRFLOW__MPI__DEPLOYMENT", "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_explicit_name_wins(unset: pytest.MonkeyPatch) -> None:
    unset.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "jwt-of-staging-0123456789")
    unset.setenv("AIRFLOW__MPI__DEPLOYMENT", "staging")
    assert deployment_identity() == "staging"


def test_two_deployments_differ_by_their_jwt_secret_and_leak_nothing(unset: pytest.MonkeyPatch) -> None:
    unset.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "jwt-of-staging-0123456789")
    staging = deployment_identity()
    unset.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "jwt-of-production-0123456789")
    production = deployment_identity()
    assert staging != production and re.fullmatch(r"h[a-z2-7]{15}", staging)
    assert deployment_identity() == production  # stable: every try, every worker of one deployment


def test_a_bad_explicit_name_fails_the_task_naming_the_option(unset: pytest.MonkeyPatch) -> None:
    unset.setenv("AIRFLOW__MPI__DEPLOYMENT", "my staging")
    with pytest.raises(AirflowFailException, match=r"\[mpi\] deployment is 'my staging'.*AIRFLOW__MPI__DEPLOYMENT"):
        deployment_identity()


def test_the_run_identity_carries_the_deployment(unset: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    unset.setenv("AIRFLOW__MPI__DEPLOYMENT", "production")
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=None, try_number=2)
    identity = run_identity({"ti": ti})  # type: ignore[typeddict-item]
    assert (identity.deployment, identity.map_index, identity.try_number) == ("production", -1, 2)


def test_the_config_file_on_disk_decides_not_a_value_held_in_memory(unset: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A process that read its configuration before airflow.cfg existed holds a generated secret
    (or none) in memory; the file is what every process of the deployment reads alike."""
    unset.setenv("AIRFLOW_HOME", str(tmp_path))
    unset.delenv("AIRFLOW_CONFIG", raising=False)
    assert deployment_identity() == ""  # no file yet, nothing in the environment
    (tmp_path / "airflow.cfg").write_text("[api_auth]\njwt_secret = written-once-0123456789\n")
    from_file = deployment_identity()
    unset.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "written-once-0123456789")
    assert from_file == deployment_identity() != ""  # the same secret, read from either place
