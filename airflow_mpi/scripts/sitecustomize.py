"""Loaded by every Python rank (the rank wrapper puts this directory first on PYTHONPATH).

Makes stdout and stderr line-buffered: each line reaches mpiexec in one write, so the task log
gets it at once and ``--tag-output`` never tags half a line (as it does with unbuffered output).
Registers the process for stack dumps (docs/contract.md#stacks): ``faulthandler`` writes every
thread's Python stack to ``$AIRFLOW_MPI_STACKS_DIR/rank-<R>.<pid>`` on SIGUSR2, from its C signal
handler, so a rank blocked inside a collective or a read answers too (a Python-level handler
would wait for the main thread, which is the one stuck). ``launch.sh stacks`` sends the signal to
the registered processes only. Nothing else runs until someone asks.

Then runs any other ``sitecustomize`` further down the path, as Python would have.
"""

import importlib.machinery
import importlib.util
import os
import sys

for _stream in (sys.stdout, sys.stderr):
    try:
        _stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        pass


def _register_for_stacks() -> None:
    # The rank as the launcher numbers it: Open MPI's variable, or Hydra's (MPICH, Intel MPI).
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK", "")
    directory = os.environ.get("AIRFLOW_MPI_STACKS_DIR", "")
    if not rank.isdigit() or not directory:
        return
    import atexit
    import faulthandler
    import signal

    pid = os.getpid()
    path = os.path.join(directory, f"rank-{int(rank)}.{pid}")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        handle = open(path, "ab", buffering=0)  # noqa: SIM115 (faulthandler keeps it open)
        faulthandler.register(signal.SIGUSR2, file=handle, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return  # no stacks for this process: the job runs as before

    def _unregister() -> None:
        if os.getpid() == pid:  # not in a forked child, whose file this is not
            try:
                os.unlink(path)
            except OSError:
                pass

    atexit.register(_unregister)


_register_for_stacks()

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_next = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
