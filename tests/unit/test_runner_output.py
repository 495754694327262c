"""What the runner makes of the master's output, with a backend that plays a scripted output:
progress bars thinned, rank-start reports folded (or the job failed when ranks are missing),
refused result lines warned about, replayed lines (reattach) not shown twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_mpi.exceptions import JobFailed
from airflow_mpi.observe.lines import PartialLine, RankLineSplitter
from airflow_mpi.observe.readiness import HostProbe, HostProblem
from airflow_mpi.observe.status import PodPhase, PodState
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import Role
from tests.helpers import plan_for, spec_from

PLAN = plan_for(spec_from(master={"cpu": 2}, workers={"replicas": 1, "cpu": 2}, startup_timeout=1))
MASTER, WORKER = PLAN.master.name, PLAN.workers[0].name
START = b"[airflow-mpi] starting mpiexec: 4 rank(s)\n"


def starts(*ranks: int) -> bytes:
    hosts = [MASTER, MASTER, WORKER, WORKER]
    return b"".join(f"[1,{r}]<stdout>:AIRFLOW_MPI_RANK_START rank={r} size=4 host={hosts[r]}\n".encode() for r in ranks)


class Played:
    """A backend whose master prints ``chunks`` (bytes, or a pause in seconds), then ends."""

    name = "played"

    def __init__(self, chunks: list[bytes | float], *, hang: bool = False) -> None:
        self.chunks, self.hang, self.ended = chunks, hang, False

    def follow_master(self, job_name: str, idle_tick: float = 0.1) -> Iterator[list[str]]:
        lines = RankLineSplitter()
        for chunk in self.chunks:
            if isinstance(chunk, float):
                end = time.monotonic() + chunk
                while time.monotonic() < end:
                    time.sleep(0.02)
                    yield []
                continue
            batch: list[str] = lines.feed(chunk)
            batch += lines.progress()
            yield batch
        while self.hang:
            time.sleep(0.02)
            yield []
        self.ended = True
        yield lines.flush()

    def pod_states(self, job_name: str) -> list[PodState]:
        master = PodState(MASTER, Role.MASTER, PodPhase.SUCCEEDED if self.ended else PodPhase.RUNNING, exit_code=0)
        return [master, PodState(WORKER, Role.WORKER, PodPhase.RUNNING, ready=True)]

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        return []


def finish(backend: Played, **options: Any) -> tuple[list[str], list[str], Any]:
    shown: list[str] = []
    warned: list[str] = []
    runner = JobRunner(
        backend,  # type: ignore[arg-type]
        PLAN,
        emit=lambda text: shown.extend(text.splitlines()),
        warn=warned.append,
        marks={"mpiexec_started": time.time()},
        **options,
    )
    return shown, warned, runner.finish()


def test_a_bar_and_rank_reports_become_a_few_lines_and_a_bad_result_is_warned_about() -> None:
    bar = b"".join(f"[1,0]<stderr>:\r{i:>5}/20000".encode() for i in range(1, 20_001))
    output: list[bytes | float] = [START, starts(0, 1, 2, 3), bar[: len(bar) // 2], 0.3, bar[len(bar) // 2 :]]
    output += [
        b"[1,0]<stderr>:\n",
        b"[1,2]<stdout>:AIRFLOW_MPI_RESULT {oops\n",
        b'[1,0]<stdout>:AIRFLOW_MPI_RESULT {"ok": 1}\n',
    ]
    shown, warned, result = finish(Played(output))
    assert not any("AIRFLOW_MPI_RANK_START" in line for line in shown)
    assert "airflow-mpi: all 4 rank(s) started" in "\n".join(shown) and f"2-3 on {WORKER}" in "\n".join(shown)
    progress = [line for line in shown if "/20000" in line]
    assert 1 <= len(progress) <= 4 and progress[-1] == "[1,0]<stderr>:20000/20000"
    assert result.result == {"ok": 1}
    (warning,) = warned
    assert warning.startswith("airflow-mpi: WARNING: rank 2: its AIRFLOW_MPI_RESULT line is not JSON")


def test_ranks_that_never_report_fail_the_job_naming_them_and_their_pod() -> None:
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        finish(Played([START, starts(0, 1), b"[1,0]<stdout>:waiting for the others\n"], hang=True))
    waited = time.monotonic() - started
    assert 1.0 <= waited < 3.0  # startup_timeout=1: the bound on ranks starting
    message = str(caught.value)
    assert message.startswith(
        f"MPI job {PLAN.job_name} failed: 2 of 4 ranks started within 1 s of mpiexec's start; "
        f"missing rank(s) 2-3 expected on pod {WORKER}."
    )
    assert caught.value.rank == 2 and caught.value.pod == WORKER
    assert "  | [1,0]<stdout>:waiting for the others" in message  # the master's last lines


def test_a_job_that_ends_well_without_every_rank_fails() -> None:
    with pytest.raises(JobFailed, match="3 of 4 ranks started before mpiexec ended; missing rank"):
        finish(Played([START, starts(0, 1, 2)]))


def test_replayed_lines_are_tracked_not_shown_and_progress_snapshots_are_no_lines() -> None:
    output: list[bytes | float] = [b"[1,0]<stdout>:one\n", b"[1,0]<stderr>:\r1%\r2%\r3%", b"\n[1,0]<stdout>:two\n"]
    output += [b'[1,0]<stdout>:AIRFLOW_MPI_RESULT {"r": 2}\n']
    shown, _, result = finish(Played(output), skip_lines=2)  # "one" and the bar's line were shown before
    assert shown == [
        "[1,0]<stdout>:two",
        '[1,0]<stdout>:AIRFLOW_MPI_RESULT {"r": 2}',
        f"airflow-mpi: job {PLAN.job_name} succeeded",
    ]
    assert result.result == {"r": 2}


def test_partial_lines_do_not_count_as_lines() -> None:
    assert isinstance(PartialLine("\rx"), str)
    counted: list[int] = []
    played = Played([b"[1,0]<stderr>:\r1%\r2%\r3%\r4%", 0.2, b"\n"])
    JobRunner(
        played,  # type: ignore[arg-type]
        PLAN,
        emit=lambda text: None,
        on_progress=counted.append,
        marks={"mpiexec_started": time.time()},
    ).finish()
    assert counted[-1] == 1  # one line, however many states it went through


class StartedWithWorkers(Played):
    """A Kubernetes-like backend whose master starts with its worker: the worker is seen Ready only
    ``ready_after`` seconds in, while the master's launch script has run mpiexec already."""

    def __init__(self, chunks: list[bytes | float], ready_after: float) -> None:
        super().__init__(chunks)
        self.ready_at = time.monotonic() + ready_after
        self.follows = 0

    def follow_master(self, job_name: str, idle_tick: float = 0.1) -> Iterator[list[str]]:
        self.follows += 1
        yield from super().follow_master(job_name, idle_tick)

    def probe_workers(self, job_name: str) -> list[HostProbe]:
        ready = time.monotonic() >= self.ready_at
        return [HostProbe(WORKER, HostProblem.OK if ready else HostProblem.NOT_READY, "")]

    def wait_for_change(self, job_name: str, timeout: float) -> None:
        time.sleep(timeout)

    def queue_status(self, job_name: str) -> str | None:
        return None

    def starts_master_with_workers(self, plan: Any) -> bool:
        return True

    def create(self, plan: Any) -> None: ...
    def start_master(self, job_name: str) -> None: ...
    def teardown(self, job_name: str) -> None: ...
    def release(self, job_name: str) -> None: ...
    def custom_objects_to_delete(self, plan: Any) -> list[tuple[str, str, str]]:
        return []

    def leftovers(self, job_name: str) -> list[str]:
        return []


def test_a_master_started_with_its_workers_shows_its_ranks_before_they_are_seen_ready() -> None:
    output: list[bytes | float] = [START, starts(0, 1, 2, 3), b"[1,2]<stdout>:training\n", 0.6]
    output += [b'[1,0]<stdout>:AIRFLOW_MPI_RESULT {"ok": 1}\n']
    backend = StartedWithWorkers(output, ready_after=0.4)
    shown: list[str] = []
    result = JobRunner(backend, PLAN, emit=lambda text: shown.extend(text.splitlines())).run()  # type: ignore[arg-type]
    ready = next(i for i, line in enumerate(shown) if line.startswith("airflow-mpi: sshd ready"))
    assert shown.index("[1,2]<stdout>:training") < ready  # shown while the worker was not yet seen Ready
    assert shown.count("[1,2]<stdout>:training") == 1 and backend.follows == 1  # one follow, each line once
    assert result.result == {"ok": 1}
