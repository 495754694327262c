"""``@task.mpi``: a Python function run as an MPI job, on every rank, under mpiexec.

    @task.mpi(workers={"replicas": 2}, env={"OMP_NUM_THREADS": "1"}, timeout=900)
    def train(data_dir: str, epochs: int) -> dict:
        import torch
        ...                       # runs on every rank
        return {"accuracy": acc}  # rank 0's return value is the task's return value (XCom)

The decorator takes the job fields of ``MPIJobOperator``'s ``job`` (``name``, ``image``, ``master``,
``workers``, ``env``, ``mpi``, ``timeout``, ``pod``, ...; not ``command``: the function is the
command) and its ``mpi_conn_id``, ``deferrable`` and ``reattach``, plus ``python``: the image's
interpreter. At run time the function's source and its resolved arguments (templates and XComArgs
rendered, as for every ``@task``) travel in the job's config directory (``taskflow``); every rank
runs them with ``airflow_mpi/scripts/taskflow_runner.py``. Mapped (``train.expand(lr=[...])``),
each map index is its own job.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory

from airflow_mpi.compat import AirflowFailException, context_keys
from airflow_mpi.decorators.taskflow import FunctionCall, build_taskflow_files, function_source, runner_command
from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.operators.mpi import MPIJobOperator
from airflow_mpi.operators.xcomkeys import JOB_SUMMARY
from airflow_mpi.spec import MPIJobSpec

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_mpi.events import JobEvent

# The job fields the decorator takes; the function is the command, and its files are generated.
JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(MPIJobSpec)) - {"command", "files"}
MAX_DEFAULT_NAME = 38  # fits pod names up to 1000 workers (docs/contract.md#roles-and-names)


class _MPIDecoratedOperator(DecoratedOperator, MPIJobOperator):
    """The operator behind ``@task.mpi``: an ``MPIJobOperator`` whose command runs the function."""

    custom_operator_name = "@task.mpi"
    template_fields: Sequence[str] = ("op_args", "op_kwargs", *MPIJobOperator.template_fields)
    template_fields_renderers = {"op_args": "py", "op_kwargs": "py", "job": "json"}
    shallow_copy_attrs: Sequence[str] = ("python_callable",)

    def __init__(self, *, python_callable: Callable[..., Any], python: str = "python", **kwargs: Any) -> None:
        refused = [name for name in ("command", "files", "job") if name in kwargs]
        issues = [
            SpecIssue(name, "is not a @task.mpi argument: the decorated function is the job's command", "remove it")
            for name in refused
        ]
        issues += _context_parameters(python_callable)
        if not isinstance(python, str) or not python.strip():
            issues.append(SpecIssue("python", f"is {python!r}", "give the image's Python, e.g. 'python3'"))
        if issues:
            raise SpecError(issues)
        job = {name: kwargs.pop(name) for name in list(kwargs) if name in JOB_FIELDS}
        job.setdefault("name", default_job_name(python_callable.__name__))
        job["command"] = runner_command(python)
        self.python = python
        super().__init__(python_callable=python_callable, job=job, **kwargs)

    def execute(self, context: Context) -> Any:
        # MPIJobOperator's own execute, not DecoratedOperator's: that one only adds Asset inlets
        # and outlets (the arguments and the result are JSON here, never Assets) around a private
        # output hook whose signature changed between Airflow releases (3.0 passes an xcom_push
        # the Task SDK's operators no longer have).
        self._ship_function()
        return self._returned(context, MPIJobOperator.execute(self, context))

    def execute_complete(self, context: Context, event: JobEvent) -> Any:
        self._ship_function()  # the same files: the spec must render the same plan
        return self._returned(context, MPIJobOperator.execute_complete(self, context, event))

    def _ship_function(self) -> None:
        """Put the function and its resolved arguments into the job's files; refuse, before
        anything is created, arguments JSON cannot hold or that are too large."""
        function = self.python_callable
        lines, first_line = inspect.getsourcelines(function)
        filename = inspect.getsourcefile(function) or f"<{function.__name__}>"
        parameters = [
            p.name
            for p in inspect.signature(function).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        try:
            call = FunctionCall(
                source=function_source(function.__name__, lines, first_line, filename),
                args=[_plain(value) for value in self.op_args],
                kwargs={name: _plain(value) for name, value in self.op_kwargs.items()},
                parameters=parameters,
            )
            files = build_taskflow_files(call)
        except SpecError as error:
            raise AirflowFailException(str(error)) from error  # retrying cannot fix these
        self.job = {**self.job, "files": files}

    def _returned(self, context: Context, summary: dict[str, Any]) -> Any:
        """Rank 0's return value; the job's summary goes to its own XCom key."""
        try:
            context["ti"].xcom_push(key=JOB_SUMMARY, value={k: v for k, v in summary.items() if k != "result"})
        except Exception as error:  # the summary is extra: never fail a finished job on it
            self.log.warning("could not push the job summary to XCom key %r: %s", JOB_SUMMARY, error)
        # As is: a rank's result is JSON, never an Asset for the task's outlets (what Airflow's
        # own output handling, private and with a signature that changed in 3.1, adds).
        return summary.get("result")


def mpi_task(
    python_callable: Callable[..., Any] | None = None,
    multiple_outputs: bool | None = None,
    **kwargs: Any,
) -> TaskDecorator:
    """``@task.mpi(...)``: run the function on every rank of an MPI job; rank 0's return value
    (JSON, at most 32 KiB) is the task's. Takes the job fields and ``MPIJobOperator``'s arguments."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_MPIDecoratedOperator,
        **kwargs,
    )


def default_job_name(function_name: str) -> str:
    """The function's name as a job name: lowercase DNS label, starting with a letter."""
    name = re.sub(r"[^a-z0-9]+", "-", function_name.lower()).strip("-")
    name = name if re.match(r"[a-z]", name) else f"task-{name}".rstrip("-")
    return name[:MAX_DEFAULT_NAME].rstrip("-")


def _context_parameters(function: Callable[..., Any]) -> list[SpecIssue]:
    """The function runs in the job's pods, where there is no task context to fill these in."""
    return [
        SpecIssue(
            f"{function.__name__}({name})",
            "is an Airflow context name, but the function runs in the job's pods, without the task context",
            f"rename it and pass the value you need as an argument, e.g. {name}='{{{{ {name} }}}}' for a template",
        )
        for name in inspect.signature(function).parameters
        if name in context_keys()
    ]


def _plain(value: Any) -> Any:
    """A lazy sequence of XCom values (a mapped task's results) as the list it stands for."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | list | tuple):
        return list(value)
    if isinstance(value, Mapping) and not isinstance(value, dict):
        return dict(value)
    return value
