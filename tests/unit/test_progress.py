"""The hang watchdog's rule (observe.progress) and the stack report (observe.stacks), pure: lines
with the times they arrived in, the verdict out; a pod's ``launch.sh stacks`` text in, the log's
lines and the ranks that did not answer out."""

from __future__ import annotations

import pytest

from airflow_mpi.exceptions import SpecError
from airflow_mpi.observe.master_output import MasterOutput, OutputPlan
from airflow_mpi.observe.progress import Hang, ProgressWatch
from airflow_mpi.observe.stacks import build_report, parse_stacks
from airflow_mpi.spec import MPIJobSpec

START = "[airflow-mpi] starting mpiexec: 3 rank(s)"


def watch(timeout: float | None = 10, pattern: str | None = None, np: int = 3) -> ProgressWatch:
    w = ProgressWatch(timeout, pattern, np)
    w.feed([START], 0.0)
    return w


def test_the_clock_starts_with_mpiexec_and_any_line_of_any_rank_resets_it() -> None:
    w = ProgressWatch(10, None, 3)
    w.feed(["MPI_NP=3", "[airflow-mpi] sshd on 2 host(s)"], 0.0)
    assert w.hang(1000.0) is None  # mpiexec not started: startup_timeout's business
    w.feed([START], 100.0)
    assert w.hang(109.9) is None
    w.feed(["[1,2]<stderr>:warming up"], 109.0)
    assert w.hang(118.9) is None
    hang = w.hang(119.0)
    assert hang is not None and hang.whole_job
    assert [s.rank for s in hang.silent] == [0, 1, 2]  # quietest first
    assert {s.rank: s.last_line for s in hang.silent} == {0: None, 1: None, 2: "warming up"}


def test_the_products_own_notes_are_no_progress() -> None:
    w = watch()
    w.feed(["[airflow-mpi] something of ours"], 9.0)
    assert w.hang(10.0) is not None


def test_without_a_pattern_a_rank_that_never_prints_is_not_judged_alone() -> None:
    # Most jobs print from rank 0 only: ranks 1 and 2 silent for an hour is normal.
    w = watch(np=3)
    for t in range(0, 3600, 5):
        w.feed([f"[1,0]<stdout>:step {t}"], float(t))
    assert w.hang(3600.0) is None


def test_with_a_pattern_only_matching_lines_count() -> None:
    w = watch(pattern=r"^step \d+")
    for t in range(1, 30):
        w.feed(["[1,0]<stdout>:heartbeat", "[1,1]<stdout>:heartbeat"], float(t))
    hang = w.hang(30.0)
    assert hang is not None and hang.whole_job and hang.patterned
    assert "no rank printed a line matching progress_pattern for 10s" in hang.summary()
    assert hang.silent[0].last_line == "heartbeat"


def test_with_a_pattern_one_rank_silent_while_the_others_go_on_is_hung() -> None:
    w = watch(pattern=r"^step")
    w.feed(["[1,0]<stdout>:step 0", "[1,1]<stdout>:step 0", "[1,2]<stdout>:step 0"], 1.0)
    for t in range(2, 14):
        w.feed(["[1,0]<stdout>:step", "[1,2]<stdout>:step"], float(t))
    assert w.hang(10.9) is None
    hang = w.hang(11.0)
    assert hang is not None and not hang.whole_job and hang.ranks == [1]
    assert "rank(s) 1 printed no line matching progress_pattern for 10s" in hang.summary()


def test_untagged_output_is_judged_as_one() -> None:
    w = watch(np=0)
    w.feed(["plain output"], 5.0)
    hang = w.hang(15.0)
    assert hang is not None and [s.rank for s in hang.silent] == [None]


def test_off_is_off() -> None:
    w = watch(timeout=None)
    assert w.hang(1e9) is None and not w.enabled


def test_a_hang_survives_a_trigger_event_whole() -> None:
    w = watch(pattern="step")
    w.feed(["[1,0]<stdout>:step 1 loss 0.3"], 2.0)
    hang = w.hang(20.0)
    assert hang is not None
    assert Hang.from_dict(hang.to_dict()) == Hang(
        hang.timeout, tuple(type(s)(s.rank, round(s.seconds, 3), s.last_line) for s in hang.silent), True, True
    )


def test_the_master_output_carries_the_watch_and_its_settings_through_the_trigger() -> None:
    plan = OutputPlan("j", "m", 2, ("m", "w"), ("m", "w"), 60.0, 5.0, "step")
    assert OutputPlan.from_dict(plan.to_dict()) == plan
    out = MasterOutput(OutputPlan.from_dict(plan.to_dict()), lambda _text: None)
    out.take([START, "[1,0]<stdout>:step 1"], 0.0)
    assert out.hang(4.9) is None and out.hang(5.0) is not None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"progress_timeout": 0}, "progress_timeout: is 0"),
        ({"progress_pattern": "step"}, "progress_pattern: is set without progress_timeout"),
        ({"progress_timeout": 5, "progress_pattern": "("}, "progress_pattern: is not a pattern RE2 can run"),
        ({"progress_timeout": 5, "progress_pattern": ".*"}, "matches an empty line"),
    ],
)
def test_bad_watchdog_settings_are_refused_naming_the_field(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(SpecError) as caught:
        MPIJobSpec.from_dict({"name": "j", "command": ["python", "t.py"], **fields})
    assert problem in str(caught.value)


POD_TEXT = """AIRFLOW_MPI_STACK rank=1 pid=42 host=j-worker-0 state=answered proc=S
Thread 0x00007f (most recent call first):
  File "t.py", line 8 in allreduce_step

AIRFLOW_MPI_STACK rank=1 pid=57 host=j-worker-0 state=stopped proc=T
AIRFLOW_MPI_STACK rank=2 pid=43 host=j-worker-0 state=silent proc=D
"""


def test_a_pods_report_is_parsed_per_process_and_rendered_per_rank() -> None:
    stacks = parse_stacks("noise before\n" + POD_TEXT)
    assert [(s.rank, s.pid, s.state) for s in stacks] == [(1, 42, "answered"), (1, 57, "stopped"), (2, 43, "silent")]
    assert stacks[0].lines == ("Thread 0x00007f (most recent call first):", '  File "t.py", line 8 in allreduce_step')
    report = build_report({"j-worker-0": POD_TEXT}, {"j-worker-1": "pod j-worker-1 is not running"})
    # rank 1 answered in one of its processes; rank 2 did not; rank 0 never registered.
    assert report.silent_ranks(np=3) == [0, 2]
    lines = report.render(["j-master-0", "j-worker-0", "j-worker-0"], np=3)
    assert lines[0] == "--- rank 0 on pod j-master-0: no Python process registered for stacks"
    assert "--- rank 1 on pod j-worker-0, pid 42:" in lines
    assert '      File "t.py", line 8 in allreduce_step' in lines
    assert (
        "--- rank 1 on pod j-worker-0, pid 57 did not answer: the process is stopped (SIGSTOP or a debugger)" in lines
    )
    assert any(line.startswith("--- rank 2 on pod j-worker-0, pid 43 did not answer in time") for line in lines)
    assert lines[-1] == "--- pod j-worker-1: could not be asked for stacks: pod j-worker-1 is not running"
