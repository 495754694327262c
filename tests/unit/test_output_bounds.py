"""Reading the master's output is bounded by the job, not by what ranks print: a tag of no rank of
the job (a rank outside 0..np-1, another job index, thousands of digits) is text of the stream it
came in, each rank keeps at most one stream per output stream, numbers are read with a bounded
digit count, and the result is rank 0's own."""

from __future__ import annotations

import tracemalloc

import pytest

from airflow_mpi.observe.lines import RankLineSplitter, rank_pattern
from airflow_mpi.observe.master_output import MasterOutput, OutputPlan
from airflow_mpi.observe.output import OutputTracker, ProgressFilter, parse_tag, split_tag
from airflow_mpi.observe.progress import ProgressWatch
from airflow_mpi.observe.worldsize import RankStartCheck

NP = 4
HUGE = "9" * 5000  # int() refuses 4301 digits or more


def split(data: bytes, np: int | None = NP) -> list[str]:
    splitter = RankLineSplitter(np=np)
    return splitter.feed(data) + splitter.flush()


@pytest.mark.parametrize("fake", ["[1,4]", "[1,12345]", "[2,0]", "[0,1]", f"[1,{HUGE}]", f"[{HUGE},0]", "[1,01]"])
def test_a_tag_of_no_rank_of_the_job_is_text_of_the_stream_it_came_in(fake: str) -> None:
    rank_line = f"[1,1]<stdout>:before {fake}<stdout>:after\n".encode()
    assert split(rank_line) == [rank_line.decode().rstrip("\n")]  # fast path and slow path alike
    assert split(b"[1,2]<stdout>:x" + rank_line) == [rank_line.decode().rstrip("\n"), "[1,2]<stdout>:x"]
    untagged = f"{fake}<stdout>:looks tagged\n".encode()
    assert split(untagged) == [untagged.decode().rstrip("\n")]


def test_a_flood_of_fake_tags_opens_no_stream() -> None:
    """2,000 tag-shaped pieces in one rank's line held 6 MB before; now nothing beyond the line."""
    splitter = RankLineSplitter(np=NP)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    line = b"[1,0]<stdout>:" + b"".join(b"[1,%d]<stdout>:x" % (1000 + i) for i in range(2000))
    for start in range(0, len(line), 4096):
        splitter.feed(line[start : start + 4096])
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(splitter._streams) == 1  # rank 0's stdout, its line still open
    assert held < 200_000, held
    (whole,) = splitter.feed(b"\n")
    assert whole == line.decode()


def test_idle_streams_are_freed_and_each_rank_keeps_at_most_its_own() -> None:
    splitter = RankLineSplitter(np=NP)
    for rank in range(NP):
        splitter.feed(b"[1,%d]<stdout>:part" % rank)  # a piece without its newline: a stream each
    assert len(splitter._streams) == NP
    for rank in range(NP):
        assert splitter.feed(b"[1,%d]<stdout>: end\n" % rank) == [f"[1,{rank}]<stdout>:part end"]
    assert splitter._streams == {}


def test_without_a_world_size_ranks_are_bounded_by_the_largest_job() -> None:
    assert split(b"[1,65535]<stdout>:ok\n", np=None) == ["[1,65535]<stdout>:ok"]
    line = f"[1,{HUGE}]<stdout>:x\n".encode()
    assert split(line, np=None) == [line.decode().rstrip("\n")]


@pytest.mark.parametrize("np", [1, 2, 9, 10, 11, 99, 100, 101, 1000, 4096, 65536])
def test_rank_pattern_is_exactly_0_to_np_minus_1(np: int) -> None:
    import re

    pattern = re.compile(rank_pattern(np) + r"\Z")
    assert [n for n in range(np + 200) if pattern.match(str(n))] == list(range(np))
    assert not pattern.match("00") and not pattern.match("-1")


def test_every_reader_takes_only_the_jobs_ranks() -> None:
    assert parse_tag("[1,3]<stdout>:hi", NP) == (3, "hi")
    assert parse_tag("[1,4]<stdout>:hi", NP) == (None, "[1,4]<stdout>:hi")
    assert parse_tag(f"[1,{HUGE}]<stdout>:hi", NP)[0] is None
    assert split_tag("[2,0]<stderr>:hi", NP) == ("", "[2,0]<stderr>:hi")
    tracker = OutputTracker(np=NP)
    tracker.feed([f"[1,{r}]<stdout>:x" for r in range(100)])
    assert sorted(tracker._rank_tails) == list(range(NP))
    watch = ProgressWatch(10, None, NP)
    watch.feed(["[airflow-mpi] starting mpiexec", *[f"[1,{r}]<stdout>:x" for r in range(100)]], 1.0)
    assert set(watch.last_line) == {0, 1, 2, 3, None}
    bars = ProgressFilter(interval=10.0, np=NP)
    for rank in range(100):
        bars.feed([f"[1,{rank}]<stderr>:\r1%", f"[1,{rank}]<stderr>:\r2%"], 0.0)
    assert len(bars._shown_at) <= NP + 1


def test_numbers_of_any_length_never_raise() -> None:
    tracker = OutputTracker(np=NP)
    tracker.feed(
        [
            f"[1,{HUGE}]<stdout>:AIRFLOW_MPI_RESULT 1",
            f"Process name: [[1,0],{HUGE}]",
            f"  Exit code: {HUGE}",
            f"MPI_ABORT was invoked on rank {HUGE} in communicator",
            f"Abort({HUGE}) on node 1 (rank {HUGE} in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1)",
            f"process rank {HUGE} with PID 1 on node a exited on signal {HUGE}",
        ]
    )
    assert tracker.failed_rank is None and tracker.failed_exit_code is None and tracker.result is None
    check = RankStartCheck(np=NP, rank_pods=(), job_pods=(), timeout=60)
    kept = check.feed([f"[1,0]<stdout>:AIRFLOW_MPI_RANK_START rank={HUGE} size=4 host=p"], 0.0)
    assert len(kept) == 1 and check.hosts == {}


def test_a_rank_start_report_counts_only_from_that_rank_and_within_the_job() -> None:
    check = RankStartCheck(np=NP, rank_pods=(), job_pods=(), timeout=60)
    kept = check.feed(
        [
            "[1,3]<stdout>:AIRFLOW_MPI_RANK_START rank=0 size=4 host=p",  # rank 3 speaking for rank 0
            "[1,2]<stdout>:AIRFLOW_MPI_RANK_START rank=7 size=4 host=p",  # no rank of the job
            "[1,1]<stdout>:AIRFLOW_MPI_RANK_START rank=1 size=4 host=p",  # its own: folded
        ],
        0.0,
    )
    assert len(kept) == 2 and check.hosts == {1: "p"}


def test_the_result_is_rank_0s_own() -> None:
    tracker = OutputTracker(np=NP)
    tracker.feed(['[1,1]<stdout>:AIRFLOW_MPI_RESULT {"from": 1}'])
    assert tracker.result is None  # another rank's result is checked, never taken for rank 0's
    tracker.feed(['[1,3]<stdout>:[1,0]<stdout>:AIRFLOW_MPI_RESULT {"fake": 1}'])
    tracker.feed(['[1,9]<stdout>:AIRFLOW_MPI_RESULT {"fake": 9}', 'AIRFLOW_MPI_RESULT {"untagged": 1}'])
    assert tracker.result is None
    tracker.feed(['[1,0]<stdout>:AIRFLOW_MPI_RESULT {"from": 0}'])
    assert tracker.result == {"from": 0}
    untagged = OutputTracker(np=NP)  # mpi.tag_output: false
    untagged.feed(['AIRFLOW_MPI_RESULT {"untagged": 1}'])
    assert untagged.result == {"untagged": 1}


def test_the_master_output_reads_bounded_by_its_plan() -> None:
    plan = OutputPlan("job-1", "job-1-master-0", NP, (), (), 60.0)
    output = MasterOutput(plan, lambda record: None)
    splitter = RankLineSplitter(np=plan.np)
    data = b"".join(b'[1,%d]<stdout>:AIRFLOW_MPI_RESULT {"r": %d}\n' % (rank, rank) for rank in (12345, 7, 2))
    output.take(splitter.feed(data), 0.0)
    assert output.output.result is None
    output.take(splitter.feed(b'[1,0]<stdout>:AIRFLOW_MPI_RESULT {"r": 0}\n'), 0.0)
    assert output.output.result == {"r": 0}
