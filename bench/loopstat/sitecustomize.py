"""Where an event loop's long steps go, for ``bench/real_triggerer_logs.py --loop-stats``.

Put on ``PYTHONPATH`` of Airflow's triggerer (its trigger runner is a fork of it), this times every
step (``asyncio.Handle._run``) of the loop and, for each over ``LONG_STEP`` seconds, writes one
JSON line: its wall time split, from the thread's ``/proc/.../schedstat``, into time on a CPU and
time waiting for one (runnable, not run: CPU contention); the rest was the thread blocked in a
system call. What ran: the task's name (``log-<pod>`` is a log follow) and the innermost frames
of the loop thread's stack, sampled while the step ran long. Every ``TICK`` seconds it also
writes the loop thread's time on a CPU and waiting for one (``"tick"`` rows): a lag of the loop
made of many short steps is read from those.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

OUT = os.environ.get("AIRFLOW_MPI_LOOP_STATS")
LONG_STEP = 0.1
TICK = 0.1


def _thread_schedstat(native_id: int) -> tuple[int, int]:
    with open(f"/proc/self/task/{native_id}/schedstat") as handle:
        on_cpu, waiting, _ = handle.read().split()
    return int(on_cpu), int(waiting)


def _schedstat() -> tuple[int, int]:
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as handle:
        on_cpu, waiting, _ = handle.read().split()
    return int(on_cpu), int(waiting)


class _Step:
    """The step running now (one loop thread per process here) and the stack seen in it."""

    started: float | None = None
    thread: int | None = None
    native: int | None = None
    stack: list[str] | None = None


def _sample(path: str) -> None:
    last_tick, last_stat = time.monotonic(), None
    while True:
        time.sleep(0.02)
        if _Step.native is not None and time.monotonic() - last_tick >= TICK:
            now, stat = time.monotonic(), _thread_schedstat(_Step.native)
            if last_stat is not None:
                row = {
                    "tick": True,
                    "at": time.time(),
                    "seconds": round(now - last_tick, 4),
                    "cpu": (stat[0] - last_stat[0]) / 1e9,
                    "runqueue": (stat[1] - last_stat[1]) / 1e9,
                }
                with open(path, "a") as out:
                    out.write(json.dumps(row) + "\n")
            last_tick, last_stat = now, stat
        started, thread = _Step.started, _Step.thread
        if started is None or thread is None or _Step.stack is not None:
            continue
        if time.monotonic() - started > LONG_STEP:
            frame = sys._current_frames().get(thread)
            if frame is not None:
                _Step.stack = [
                    f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack(frame)[-8:]
                ]


def _what(handle: Any) -> str:
    task = getattr(getattr(handle, "_callback", None), "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        return f"task {task.get_name()} ({getattr(coro, '__qualname__', coro)})"
    return repr(handle)[:200]


def _install(path: str) -> None:
    original = asyncio.events.Handle._run
    sampler: list[threading.Thread] = []

    def timed_run(self: asyncio.events.Handle) -> None:
        if not sampler or sampler[0].ident is None or not sampler[0].is_alive():  # a fork has no threads
            sampler[:] = [threading.Thread(target=_sample, args=(path,), daemon=True, name="loopstat")]
            sampler[0].start()
        started, (cpu0, wait0) = time.monotonic(), _schedstat()
        _Step.thread, _Step.native, _Step.stack, _Step.started = (
            threading.get_ident(),
            threading.get_native_id(),
            None,
            started,
        )
        try:
            original(self)
        finally:
            _Step.started = None
            wall = time.monotonic() - started
            if wall > LONG_STEP:
                cpu1, wait1 = _schedstat()
                row = {
                    "pid": os.getpid(),
                    "at": time.time(),
                    "wall": round(wall, 4),
                    "cpu": round((cpu1 - cpu0) / 1e9, 4),
                    "runqueue": round((wait1 - wait0) / 1e9, 4),
                    "what": _what(self),
                    "stack": _Step.stack or [],
                }
                with open(path, "a") as out:
                    out.write(json.dumps(row) + "\n")

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]


if OUT and "triggerer" in sys.argv:
    _install(OUT)
