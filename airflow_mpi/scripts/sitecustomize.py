"""Loaded by every Python rank (the rank wrapper puts this directory first on PYTHONPATH).

Makes stdout and stderr line-buffered: each line reaches mpiexec in one write, so the task log
gets it at once and ``--tag-output`` never tags half a line (as it does with unbuffered output).
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

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_next = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
