"""Waiting for admission, one rule for the waiting runner and the deferred trigger: queued is not
stuck. While a gang scheduler or a queue holds the job, ``startup_timeout`` does not run (it
starts again from the moment the job is admitted); ``scheduling.queue_timeout``, if set, bounds
the total time the job has been seen queued. The task log says so when the reason changes and
every ``QUEUE_NOTE_INTERVAL`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUE_NOTE_INTERVAL = 60.0  # how often the task log repeats that the job still waits in a queue


@dataclass
class QueueClock:
    """The time a job waited for admission, from what each look at it found. ``start``: when the
    job was created, the start of its first queued stretch (None: the first look's time). The
    clock is the caller's (monotonic in a process, epoch seconds across a deferral)."""

    limit: float | None  # scheduling.queue_timeout
    start: float | None = None
    waited: float = 0.0  # queued stretches that ended
    since: float | None = None  # when the current queued stretch began
    _noted: tuple[str, float] | None = None

    def observe(self, reason: str | None, now: float) -> float:
        """Record one look (``reason``: why it is queued, None: not queued); the total waited."""
        if reason is None:
            if self.since is not None:
                self.waited += now - self.since
                self.since = None
            self.start = None
            return self.waited
        if self.since is None:
            self.since = self.start if self.start is not None and self.start <= now else now
            self.start = None
        return self.waited + now - self.since

    def expired(self, now: float) -> bool:
        """Whether the total queued time reached ``queue_timeout``."""
        if self.limit is None:
            return False
        current = now - self.since if self.since is not None else 0.0
        return self.waited + current >= self.limit

    def note(self, job_name: str, reason: str, now: float) -> str | None:
        """The task log's line about the wait, when the reason changed or the last line is
        ``QUEUE_NOTE_INTERVAL`` old; else None."""
        if self._noted is not None and self._noted[0] == reason and now - self._noted[1] < QUEUE_NOTE_INTERVAL:
            return None
        self._noted = (reason, now)
        waited = self.observe(reason, now)
        return f"airflow-mpi: job {job_name} waits for admission ({waited:.0f}s so far): {reason}"

    def timeout_message(self, job_name: str, reason: str, now: float) -> str:
        waited = self.observe(reason, now)
        return (
            f"MPI job {job_name} waited {waited:.0f}s for admission, past scheduling.queue_timeout ({self.limit}s): "
            f"{reason}. Free capacity in the queue, raise its quota, or raise queue_timeout"
        )
