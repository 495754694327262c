"""A deferred job's master log, followed live inside the triggerer (async, one stream per job).

The same exact follow as the waiting path (``backends.kubernetes``): ``timestamps=true`` with
``sinceTime`` and the byte cursor (``logcursor``), so a dropped or silent stream resumes with no
byte shown twice or lost; the lines go through the same ``masterlog.MasterOutput`` as a waiting
job's, whose ``emit`` writes them to the task try's log.

Bounded and fair: a chunk is at most ``CHUNK_BYTES`` (the work per event-loop step stays in the
milliseconds), and every job spends from a ``LogBudget`` (its own share and the process's) before
it reads on: a job that floods its log is read more slowly (its lines wait in the pod's log, not
here), and the jobs beside it keep their pace.

Exactly once across triggerers: every record a trigger writes names the number of master lines
read so far in its source (``logger``: ``airflow_mpi.master:<n>``; the Airflow UI shows sources
only when asked to), and goes out once the job's shown mark counts them (``logshown``, on the
job's Lease), so a trigger started again by any triggerer goes on after them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from airflow_mpi.backends.k8s_errors import CONNECT_TIMEOUT, ApiRequest, api_status, explain, is_refusal
from airflow_mpi.backends.token_file import renewed_since, token_generation
from airflow_mpi.observe.cursor import LogCursor, TimestampedLogSplitter, followed_log_call
from airflow_mpi.observe.lines import PartialLine, RankLineSplitter
from airflow_mpi.observe.master_output import MasterOutput
from airflow_mpi.observe.progress import Hang
from airflow_mpi.triggers.api_client import raise_for_status
from airflow_mpi.triggers.timeouts import timeout_after

CHUNK_BYTES = 64 * 1024  # the most one read hands the line handling at once
IDLE_TICK = 0.25  # seconds between checks (held progress states, ranks' start) when nothing arrives
LOG_READ_TIMEOUT = 60.0  # a stream silent this long is reopened from the cursor
JOB_BYTES_PER_S = 64 * 1024  # one job's share of the task-log writes (~650 lines/s of 100 bytes)
PROCESS_BYTES_PER_S = 4 * 1024 * 1024  # every job of one triggerer together
BURST_S = 1.0  # seconds of rate a quiet job may spend at once
# The log channel's own pace: a record that waits this long for the log socket (``logchannel``)
# means Airflow's triggerer supervisor is behind; each job's rate then halves (not below the
# floor) and grows back by a quarter a second while records go out at once again.
SLOW_WRITE_S = 0.05
JOB_FLOOR_BYTES_PER_S = 16 * 1024
RECOVERY_PER_S = 0.25


class TokenBucket:
    """``rate`` bytes a second, ``burst`` at most saved up; ``delay(n)`` takes ``n`` and says how
    long to wait before the next take (0 within the rate). Pure: the caller passes the clock."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.at: float | None = None

    def delay(self, size: int, now: float) -> float:
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= size
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class LogBudget:
    """The task-log writes of every followed job in one triggerer: each job within its own rate
    and the process within its total. A job past either waits (it reads on later), so one job's
    flood neither starves the others nor grows memory."""

    def __init__(self, job_rate: float = JOB_BYTES_PER_S, process_rate: float = PROCESS_BYTES_PER_S) -> None:
        self.max_job_rate = self.job_rate = job_rate
        self.process = TokenBucket(process_rate, process_rate * BURST_S)
        self.slowed_at: float | None = None  # when a slow write last halved the job rate

    def for_job(self) -> Callable[[int], float]:
        own = TokenBucket(self.job_rate, self.job_rate * BURST_S)

        def delay(size: int) -> float:
            now = time.monotonic()
            own.rate = self._job_rate(now)
            return max(own.delay(size, now), self.process.delay(size, now))

        return delay

    def wrote(self, seconds: float, now: float | None = None) -> None:
        """A record waited ``seconds`` for the log socket: past ``SLOW_WRITE_S`` the channel is behind."""
        if seconds >= SLOW_WRITE_S:
            now = time.monotonic() if now is None else now
            self.job_rate = max(JOB_FLOOR_BYTES_PER_S, self._job_rate(now) / 2)
            self.slowed_at = now

    def _job_rate(self, now: float) -> float:
        if self.slowed_at is None:
            return self.job_rate
        grown: float = self.job_rate * (1 + RECOVERY_PER_S) ** (now - self.slowed_at)
        return min(self.max_job_rate, grown)


_BUDGETS: dict[int, LogBudget] = {}  # per event loop (id): a triggerer runs one


def budget_for_loop() -> LogBudget:
    key = id(asyncio.get_running_loop())
    budget = _BUDGETS.get(key)
    if budget is None:
        _BUDGETS.clear()  # an earlier loop (tests run several) is gone
        budget = _BUDGETS[key] = LogBudget()
    return budget


MASTER_LOGGER = "airflow_mpi.master"  # the source of the records of the master's lines


def build_mark(lines: int) -> str:
    """The source (``logger``) of a record: the master's log, read through its ``lines``-th line."""
    return f"{MASTER_LOGGER}:{lines}"


async def count_log_lines(api_client: Any, namespace: str, pod: str, at_most: int, timeout: float) -> int:
    """Whole lines the master's log holds now, counted as the follow counts them, reading no
    further than ``at_most`` of them (a shown mark is checked against what the log can have
    shown: one that counts more is not believed). A pod with no log yet holds none."""
    path, arguments = followed_log_call(namespace, pod, None)
    arguments["query_params"] = [(k, "false" if k == "follow" else v) for k, v in arguments["query_params"]]
    lines = RankLineSplitter()
    stream = TimestampedLogSplitter(LogCursor(), lines)
    count = 0
    async with timeout_after(timeout):
        try:
            response = await _get_log(api_client, path, arguments, timeout)
        except Exception as error:
            if api_status(error) in (400, 404):
                return 0  # no such pod, or its container has not started: no log
            raise
        async with response:
            while count < at_most:
                chunk = await response.content.read(CHUNK_BYTES)
                if not chunk:
                    break
                count += sum(1 for line in stream.feed(chunk) if not isinstance(line, PartialLine))
    return count


async def _get_log(api_client: Any, path: str, arguments: dict[str, Any], timeout: float) -> Any:
    response = await api_client.call_api(path, "GET", **arguments, _request_timeout=(CONNECT_TIMEOUT, timeout))
    await raise_for_status(response)
    return response


class MasterLogFollower:
    """Follows one master's log into ``output`` until the stream has ended with the master
    (``master_ended``), or the world-size check fails (``failure``)."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        master: str,
        output: MasterOutput,
        master_ended: asyncio.Event,
        *,
        budget: Callable[[int], float] | None = None,
        caught_up: Callable[[], Awaitable[None]] | None = None,
        read_timeout: float = LOG_READ_TIMEOUT,
        log: Any = None,
        pod: Callable[[], str | None] | None = None,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.master = master
        # The master's own pod now: a controller's generated pod (an MPIJob launcher Job's
        # newest) is known only from the pod watch; None while there is none yet.
        self.pod = pod or (lambda: master)
        self.output = output
        self.master_ended = master_ended
        self.budget = budget or (lambda size: 0.0)
        self.caught_up = caught_up  # the task log's channel has written what was read
        self.read_timeout = read_timeout
        self.log = log
        self.cursor = LogCursor()
        # Each rank's unfinished line survives a dropped stream; a tag of no rank of the job is text.
        self.lines = RankLineSplitter(np=output.plan.np)
        self.failure: Any = None  # the world-size check's JobFailed, once it fails
        self.hang: Hang | None = None  # the hang watchdog's verdict, once the job is silent too long
        self.refused: str | None = None  # the API refused the log (403 ...): what to change
        self.streams = 0  # log streams opened (one, unless a stream dropped)

    async def run(self) -> None:
        """Until the log is over (every line shown), ``failure`` is set, or the API refused
        the log (``refused``)."""
        attempt = 0
        while True:
            pod = self.pod()
            if pod is None:  # not created yet
                if self.master_ended.is_set():
                    break
                await self._wait_for_end(0.2)
                continue
            since = self.cursor.resume()
            token = token_generation(self.api_client)
            try:
                response = await self._open(since, pod)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                status = api_status(error)
                if status == 404 and self.pod() != pod:
                    continue  # gone from the watch, or replaced by a newer pod of its controller
                if status in (400, 404) and self.master_ended.is_set():
                    break  # ended without a log to read: the pod watch says why
                if renewed_since(self.api_client, token):
                    continue  # sent with the token the kubelet has since replaced: open it again
                if is_refusal(error) and status not in (400, 404):  # as the waiting path: the job fails
                    request = ApiRequest("get", "pods/log", self.namespace, self.master)
                    self.refused = explain(error, request, str(self.api_client.configuration.host))
                    return
                else:
                    # 400: the container is not up yet. 404 for a pod the watch still has: its
                    # node's kubelet has not taken it in yet (it answers 404 for a pod it does not
                    # know). Else transient. Each is bounded by the pod watch.
                    await self._wait_for_end(min(0.2 * (attempt + 1), 2.0))
                attempt += 1
                continue
            self.streams += 1
            clean = await self._read(response)
            if self.failure is not None or self.hang is not None:
                return
            if clean and self.master_ended.is_set():
                break
            attempt += 1
            await self._wait_for_end(0.2 if clean else 0.05)
        now = time.monotonic()
        self.output.take(self.lines.flush(), now)  # lines the master left unfinished when it ended
        self.output.flush(now)

    async def _wait_for_end(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with timeout_after(seconds):
                await self.master_ended.wait()

    async def _open(self, since: str | None, pod: str) -> Any:
        path, arguments = followed_log_call(self.namespace, pod, since)
        response = await self.api_client.call_api(path, "GET", **arguments, _request_timeout=(CONNECT_TIMEOUT, None))
        await raise_for_status(response)
        return response

    async def _read(self, response: Any) -> bool:
        """Feed the stream's bytes to the output as they come; True on a clean end of stream,
        False on a drop or a stream silent for ``read_timeout``."""
        stream = TimestampedLogSplitter(self.cursor, self.lines)
        output = self.output
        heard = time.monotonic()
        try:
            async with response:
                while True:
                    try:
                        async with timeout_after(IDLE_TICK):
                            chunk = await response.content.read(CHUNK_BYTES)
                    except TimeoutError:
                        now = time.monotonic()
                        output.tick(now)
                        if self._checked(now) or now - heard > self.read_timeout:
                            return False
                        continue
                    now = heard = time.monotonic()
                    if not chunk:
                        return True
                    batch: list[str] = stream.feed(chunk)
                    batch += self.lines.progress()
                    output.take(batch, now)
                    output.tick(now)
                    if self._checked(now):
                        return False
                    delay = self.budget(len(chunk))
                    await asyncio.sleep(delay)  # 0 within the budget: a step for the other jobs
                    if self.caught_up is not None:  # the supervisor is behind: read on once it is not
                        await self.caught_up()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._note(f"the log stream of {self.master} dropped ({type(error).__name__}: {error}); resuming")
            return False

    def _checked(self, now: float) -> bool:
        """The world-size check and the hang watchdog, as the lines come: True once one failed."""
        if self.failure is None:
            self.failure = self.output.rank_failure(now)
        if self.failure is None and self.hang is None:
            self.hang = self.output.hang(now)
        return self.failure is not None or self.hang is not None

    def _note(self, text: str) -> None:
        if self.log is not None:
            self.log.warning("%s", text)
