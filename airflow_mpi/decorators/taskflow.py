"""A @task.mpi function as job files: its source, its arguments, and the runner every rank starts.

The function travels as source, not pickled: each rank compiles it with the image's Python,
which need not be Airflow's (a pickle ties both to one Python and one set of library versions,
and runs code from the Airflow side when loaded). Its arguments travel as JSON for the same
reason: JSON reads the same in any Python and holds what XCom and templates give (strings,
numbers, lists, dicts). The files go into the job's config directory (the ConfigMap on
Kubernetes), so together they must fit what the spec's ``files`` may hold; larger inputs belong
on a volume or in object storage, passed as a path or URI.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_mpi.contract import CONFIG_FILES_MAX_BYTES, RESULT_MAX_BYTES, RESULT_PREFIX
from airflow_mpi.exceptions import SpecError, SpecIssue
from airflow_mpi.scripts import taskflow_runner_text
from airflow_mpi.scripts.taskflow_runner import json_problem

RUNNER_FILE = "taskflow_runner.py"
RUNNER_BOOTSTRAP = (
    "import os, runpy; runpy.run_path(os.path.join(os.environ.get('AIRFLOW_MPI_CONFIG_DIR', '/etc/mpi'),"
    f" {RUNNER_FILE!r}), run_name='__main__')"
)
CALL_FILE = "taskflow_call.json"  # the runner reads it from its own directory
DEF_LINE = re.compile(r"^\s*(async\s+)?def\s")


@dataclass(frozen=True)
class FunctionSource:
    """A function's definition, from its ``def`` line (decorators left out), dedented, and the
    line of the DAG file that ``def`` is on (tracebacks in the pods name the DAG file's lines)."""

    name: str
    text: str
    filename: str
    first_line: int


@dataclass(frozen=True)
class FunctionCall:
    """A call of the function with resolved arguments; ``parameters`` names the positional ones."""

    source: FunctionSource
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    parameters: Sequence[str] = ()

    def labelled_arguments(self) -> list[tuple[str, Any]]:
        named = [(self._label(index), value) for index, value in enumerate(self.args)]
        return named + list(self.kwargs.items())

    def _label(self, index: int) -> str:
        return self.parameters[index] if index < len(self.parameters) else f"*args[{index - len(self.parameters)}]"


def function_source(name: str, lines: Sequence[str], first_line: int, filename: str) -> FunctionSource:
    """The definition from ``inspect.getsourcelines``' lines (decorator lines first), without the
    decorators: the function runs undecorated in the pods."""
    for offset, line in enumerate(lines):
        if DEF_LINE.match(line):
            text = textwrap.dedent("".join(lines[offset:]))
            return FunctionSource(name=name, text=text, filename=filename, first_line=first_line + offset)
    raise SpecError(
        [SpecIssue("@task.mpi", f"no 'def' line in the source of {name!r}", "decorate a function defined with def")]
    )


def runner_command(python: str) -> list[str]:
    """What every rank runs: the image's Python on the shipped runner, found through
    ``AIRFLOW_MPI_CONFIG_DIR``, which the rank wrapper exports on every backend (the config
    directory is ``/etc/mpi``, or elsewhere where a controller owns ``/etc/mpi``), so the command
    names no path. Not ``-m``: the rank's sitecustomize takes the config directory off sys.path."""
    return [python, "-c", RUNNER_BOOTSTRAP]


def build_taskflow_files(call: FunctionCall) -> dict[str, str]:
    """The runner and the call, as the spec's ``files``; SpecError names every argument JSON cannot
    hold, or, over the size limit, every argument's size, before anything is created."""
    issues = []
    encoded: list[tuple[str, str]] = []
    for label, value in call.labelled_arguments():
        problem = json_problem(value, label)
        if problem:
            issues.append(
                SpecIssue(
                    f"@task.mpi argument {label}",
                    f"{problem}; arguments travel to the pods as JSON",
                    "pass plain values (str, int, float, bool, None, lists and dicts of them): e.g. str(path), "
                    "value.isoformat(), array.tolist()",
                )
            )
        else:
            encoded.append((label, json.dumps(value)))
    if issues:
        raise SpecError(issues)
    payload = json.dumps(
        {
            "function": call.source.name,
            "source": call.source.text,
            "filename": call.source.filename,
            "first_line": call.source.first_line,
            "args": list(call.args),
            "kwargs": dict(call.kwargs),
            "result_prefix": RESULT_PREFIX,
            "result_max_bytes": RESULT_MAX_BYTES,
        }
    )
    files = {RUNNER_FILE: taskflow_runner_text(), CALL_FILE: payload}
    total = sum(_size(text) for text in files.values())
    if total > CONFIG_FILES_MAX_BYTES:
        sizes = [(f"argument {label}", _size(text)) for label, text in encoded]
        sizes += [("the function's source", _size(call.source.text)), ("the runner", _size(files[RUNNER_FILE]))]
        listed = ", ".join(f"{what} {size} bytes" for what, size in sorted(sizes, key=lambda s: -s[1]))
        raise SpecError(
            [
                SpecIssue(
                    "@task.mpi arguments",
                    f"the function's source and arguments take {total} bytes ({listed}), over the "
                    f"{CONFIG_FILES_MAX_BYTES} bytes they may hold: they travel in the job's ConfigMap, which "
                    "Kubernetes keeps under 1 MiB",
                    "pass large inputs as a path or URI (a shared volume, object storage) and read them in the "
                    "function",
                )
            ]
        )
    return files


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
