"""How the rank wrapper runs a Python rank under Hydra (MPICH, Intel MPI): as ``python -m mpi4py``
would (a script, ``-m module``, ``-c code`` or ``-``, with the same ``sys.path``), except when the
rank fails.

``python -m mpi4py`` turns a non-zero exit or an uncaught exception into ``MPI_Abort``, and a
Hydra proxy answers that by killing the rank's whole process group at once: the rank wrapper
dies before it can say which rank failed, and MPICH's proxy drops the library's own line too.
Here the rank instead prints what Python would (the traceback, or the exit message), flushes,
and leaves with ``os._exit(code)``, skipping ``MPI_Finalize`` (which would wait for the other
ranks) and ``MPI_Abort``. The wrapper, still its parent, then names the rank and code and ends
the job (docs/contract.md#rank-exit). A rank that succeeds exits as usual, through
``MPI_Finalize``. Standard library and mpi4py only: it runs in the job's image.
"""

import os
import sys


def _leave(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


def _exit_code(status: object) -> int:
    """What the process would exit with for ``sys.exit(status)``, never 0 for a failure."""
    if status is None:
        return 0
    if isinstance(status, int):
        return (status & 0xFF or 1) if status else 0  # exit(256) would read as success
    print(status, file=sys.stderr)  # as Python does for sys.exit("message")
    return 1


def main() -> None:
    from mpi4py.run import run_command_line

    # The interpreter put this file's directory first; ``python -m mpi4py`` would have put the
    # working directory there (none under -P), and a script's own directory replaces it.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]
        if not getattr(sys.flags, "safe_path", False):
            sys.path.insert(0, os.getcwd())
    try:
        run_command_line(sys.argv[1:])
    except SystemExit as exc:
        code = _exit_code(exc.code)
        if code:
            _leave(code)
        raise
    except BaseException as exc:  # what Python prints for any uncaught one, then leave
        sys.excepthook(type(exc), exc, exc.__traceback__)
        _leave(130 if isinstance(exc, KeyboardInterrupt) else 1)


if __name__ == "__main__":
    main()
