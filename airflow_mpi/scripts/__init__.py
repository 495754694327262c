"""The in-pod launch script, the ranks' sitecustomize and Python runner, shipped as package data
(the ConfigMap carries them, the image the launch script); the doctor's checks, which run beside
them but are not a job's."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def launch_script_text() -> str:
    """The launch script's text, read once from the installed package."""
    return files(__package__).joinpath("launch.sh").read_text(encoding="utf-8")


@cache
def doctor_script_text() -> str:
    """``airflow-mpi doctor``'s checks: launch.sh's functions (not its main), then doctor.sh."""
    doctor = files(__package__).joinpath("doctor.sh").read_text(encoding="utf-8")
    return f"AIRFLOW_MPI_LAUNCH_LIBRARY=1\n{launch_script_text()}\n{doctor}"


@cache
def rank_sitecustomize_text() -> str:
    """Python ranks load it first: line-buffered stdout/stderr (whole lines in the log)."""
    return files(__package__).joinpath("sitecustomize.py").read_text(encoding="utf-8")


@cache
def python_rank_text() -> str:
    """Under Hydra, a Python rank runs through it: a failed rank exits with its code, no MPI_Abort."""
    return files(__package__).joinpath("python_rank.py").read_text(encoding="utf-8")


@cache
def taskflow_runner_text() -> str:
    """The runner a @task.mpi job's ranks start: it calls the shipped function (stdlib only)."""
    return files(__package__).joinpath("taskflow_runner.py").read_text(encoding="utf-8")
