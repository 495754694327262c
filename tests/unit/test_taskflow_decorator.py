"""``@task.mpi`` as Airflow sees it: registered through the provider's task-decorators entry, the
job fields taken as MPIJobOperator takes them, and bad use refused when the DAG is parsed."""

from __future__ import annotations

import pendulum
import pytest

from airflow_mpi.decorators.mpi import _MPIDecoratedOperator, default_job_name, mpi_task
from airflow_mpi.decorators.taskflow import runner_command
from airflow_mpi.exceptions import SpecError

START = pendulum.datetime(2026, 1, 1, tz="UTC")


def test_task_mpi_resolves_through_the_provider() -> None:
    from airflow.sdk import task
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    assert "mpi" in ProvidersManagerTaskRuntime().taskflow_decorators
    assert task.mpi is mpi_task


def test_job_fields_make_the_job_and_the_function_its_command() -> None:
    from airflow.sdk import DAG, task

    with DAG("tf_unit", schedule=None, start_date=START):

        @task.mpi(workers={"replicas": 2}, env={"OMP_NUM_THREADS": "1"}, timeout=900, python="python3")
        def Train_Model(data: str, epochs: int) -> dict:  # type: ignore[type-arg]
            return {"data": data, "epochs": epochs}

        op = Train_Model("/data", epochs=2).operator

    assert isinstance(op, _MPIDecoratedOperator)
    assert op.job["name"] == "train-model" and op.job["command"] == runner_command("python3")
    assert op.job["workers"] == {"replicas": 2} and op.job["timeout"] == 900
    assert op.op_args == ("/data",) or list(op.op_args) == ["/data"]
    assert {"op_args", "op_kwargs", "job"} <= set(op.template_fields)


def test_bad_use_is_refused_at_parse_time() -> None:
    from airflow.sdk import DAG, task

    with DAG("tf_unit_bad", schedule=None, start_date=START):

        @task.mpi(command=["python", "x.py"])
        def with_command() -> None:
            return None

        with pytest.raises(SpecError, match=r"command: is not a @task.mpi argument: the decorated function is"):
            with_command()

        @task.mpi()
        def with_context(ti=None) -> None:  # type: ignore[no-untyped-def]
            return None

        with pytest.raises(SpecError, match=r"with_context\(ti\): is an Airflow context name"):
            with_context()

        @task.mpi(workers={"replicas": -1})
        def bad_spec() -> None:
            return None

        with pytest.raises(SpecError, match=r"workers.replicas"):
            bad_spec()


def test_default_job_names_are_dns_labels() -> None:
    assert default_job_name("train") == "train"
    assert default_job_name("_Fit_LR__sweep_") == "fit-lr-sweep"
    assert default_job_name("2nd_pass") == "task-2nd-pass"
    assert len(default_job_name("x" * 100)) == 38  # with the run hash and "-worker-999": 63
