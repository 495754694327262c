"""One failure builder: a deferred operator's trigger events give the same errors, with the same
messages, as the synchronous flow."""

from __future__ import annotations

from airflow_mpi import events
from airflow_mpi.events import JobEvent, Outcome
from airflow_mpi.exceptions import JobFailed, JobTimeout, SshdNotReady
from airflow_mpi.observe.status import JobPhase, JobStatus
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.runner.waits import worker_failure
from tests.helpers import plan_for, spec_from

PLAN = plan_for(spec_from(workers={"replicas": 2}, timeout=60))
WORKER = PLAN.workers[1].name


class Logs:
    """A backend as far as failure messages need one: each pod printed 30 numbered lines."""

    name = "fake"

    def pod_log_tail(self, job_name: str, pod: str, lines: int = 20) -> list[str]:
        return [f"{pod} line {i}" for i in range(30)][-lines:]


def runner() -> JobRunner:
    return JobRunner(Logs(), PLAN, emit=lambda text: None)  # type: ignore[arg-type]


def event(outcome: Outcome) -> JobEvent:
    return events.fire(outcome, {"job_name": PLAN.job_name, "at": 0.0, "try_number": 1, "marks": {}})


def test_a_worker_failure_event_reads_as_the_synchronous_one() -> None:
    cases = (
        (True, "before sshd was ready"),  # before every worker was Ready
        (False, "while training"),
    )
    for starting, when in cases:
        failed = event(events.pod_failed(WORKER, 137, f"pod {WORKER} OOMKilled", starting=starting))
        error = runner().event_failure(failed)
        status = JobStatus(JobPhase.FAILED, WORKER, 137, f"pod {WORKER} OOMKilled")
        same = worker_failure(Logs(), PLAN.job_name, status, when)  # type: ignore[arg-type]
        assert isinstance(error, JobFailed) and str(error) == str(same)
        assert error.pod == WORKER and error.exit_code == 137
        assert f"failed {when}: pod {WORKER} OOMKilled\nlast lines of {WORKER}:\n" in str(error)
        assert str(error).endswith(f"  | {WORKER} line 29") and len(error.tail) == 15


def test_timeout_events() -> None:
    not_ready = runner().event_failure(event(events.startup_timeout("1 of 2 worker host(s) did not ...")))
    assert isinstance(not_ready, SshdNotReady) and str(not_ready) == "1 of 2 worker host(s) did not ..."
    late = runner().event_failure(event(events.job_timeout("ran past")))
    assert isinstance(late, JobTimeout)
    master = PLAN.master.name
    assert str(late).startswith(f"MPI job {PLAN.job_name} ran past its timeout of 60")
    assert f"and was killed\nlast lines of {master}:\n" in str(late) and late.tail[-1] == f"{master} line 29"


def test_events_the_job_goes_on_from_give_no_error() -> None:
    assert runner().event_failure(event(events.finished())) is None
    # The master failed: its own output names the rank, so ``finish`` builds the error.
    master_failed = events.pod_failed(PLAN.master.name, 1, "Error", starting=False)
    assert runner().event_failure(event(master_failed)) is None
