"""Runs a @task.mpi function on this rank: every rank of the job runs this file, under mpiexec.

Shipped in the job's config directory next to ``taskflow_call.json`` (the function's source and
its arguments as JSON). Standard library only, and no syntax newer than Python 3.8: it runs with
the image's Python, which need not be Airflow's.

As ``python -m mpi4py`` does, an exception on one rank aborts every rank (``MPI_Abort`` when
mpi4py has initialised MPI under Open MPI; otherwise the nonzero exit makes mpiexec, or under
Hydra the rank wrapper, end the job and name the rank), after printing that rank's traceback.
Rank 0 prints its return value as one ``AIRFLOW_MPI_RESULT <json>`` line; a value JSON cannot
hold, or one over the result limit, fails the job with a message naming it.
"""

from __future__ import annotations
import __future__

import json
import linecache
import math
import os
import sys
import traceback
from typing import Any

CALL_FILE = "taskflow_call.json"
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK")
NAME_ERROR_HINT = (
    "the @task.mpi function runs from its own source in every pod, without the DAG file's globals: "
    "import modules and define constants inside its body, or pass values as arguments"
)


def this_rank() -> int:
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def load_function(call: dict[str, Any]) -> Any:
    """Compile the function's definition at its own line numbers in the DAG file, so a traceback
    names the lines the user wrote (linecache serves them: the DAG file is not in the pod)."""
    filename = call["filename"]
    source = "\n" * (call["first_line"] - 1) + call["source"]
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec", __future__.annotations.compiler_flag, True)
    namespace = {"__name__": "__main__", "__file__": filename, "__builtins__": __builtins__}
    exec(code, namespace)  # noqa: S102 (the task's own function, shipped by its DAG)
    return namespace[call["function"]]


def json_problem(value: Any, path: str) -> str | None:
    """Why JSON cannot carry ``value`` unchanged, naming the part (``path`` and below) and its
    type; None when it can. The one rule of both ends: the DAG checks a @task.mpi call's
    arguments with it, rank 0 its return value. Keys must be strings (JSON would turn 1 into
    "1"), floats finite (JSON has no NaN or Infinity: ``json.dumps`` writes a token other
    parsers refuse)."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value}, which JSON has no number for"
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = json_problem(item, f"{path}[{index}]")
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the key {key!r} ({type_name(key)}); JSON keys are strings"
            problem = json_problem(item, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    return f"{path} is a {type_name(value)}, which JSON cannot hold"


def type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def result_line(value: Any, call: dict[str, Any]) -> str:
    """The ``AIRFLOW_MPI_RESULT`` line for rank 0's return value; ValueError says why it cannot be."""
    problem = json_problem(value, "return value")
    if problem:
        raise ValueError(
            f"the @task.mpi function's {problem}; return plain Python values (dict with string keys, list, "
            "str, int, finite float, bool, None: e.g. float(x), array.tolist()), or write the output to a file "
            "and return its path"
        )
    text = json.dumps(value)
    size = len(text.encode("utf-8", "replace"))
    if size > call["result_max_bytes"]:
        raise ValueError(
            f"the @task.mpi function's return value is {size} bytes of JSON, over the {call['result_max_bytes']} "
            "bytes a result may hold (it goes into Airflow's database); return a summary, and write large "
            "outputs to a file and return its path"
        )
    return str(call["result_prefix"]) + text


def print_failure(error: BaseException) -> None:
    """The rank's traceback from the function's own frames on (the runner's are noise)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb)


def abort(code: int) -> None:
    """End every rank: MPI_Abort if this process initialised MPI (the others may wait in a
    collective for it), else exit nonzero (mpiexec then ends the job). Not MPI_Abort under Hydra
    (MPICH, Intel MPI): its answer kills the rank wrapper, which ends the job naming the rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    hydra = os.environ.get("AIRFLOW_MPI_ABORT_ON_EXIT") == "1"  # the wrapper ends the job
    if mpi is not None and not hydra and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(code)
    os._exit(code & 0xFF or 1)


def main() -> None:
    rank = this_rank()
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, CALL_FILE), encoding="utf-8") as handle:
        call = json.load(handle)
    try:
        function = load_function(call)
        value = function(*call["args"], **call["kwargs"])
        line = result_line(value, call) if rank == 0 else None
    except SystemExit as error:
        if error.code in (0, None):
            raise  # sys.exit(0): this rank is done, and returned nothing
        print_failure(error)
        abort(error.code if isinstance(error.code, int) else 1)
    except BaseException as error:  # the rank's failure, whatever it is, ends the job
        print_failure(error)
        if isinstance(error, NameError):
            print("hint: " + NAME_ERROR_HINT, file=sys.stderr)
        abort(1)
    if line is not None:
        print(line, flush=True)


if __name__ == "__main__":
    main()
