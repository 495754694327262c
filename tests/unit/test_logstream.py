"""Master output tracking: failed rank and code, results (and why one is refused), bounded
memory, rank placement, progress bars thinned for the task log."""

from __future__ import annotations

import json

from airflow_mpi.contract import RESULT_MAX_BYTES
from airflow_mpi.job.naming import build_job_name
from airflow_mpi.job.topology import build_topology
from airflow_mpi.observe.lines import CUT_MARK, PartialLine
from airflow_mpi.observe.output import OutputTracker, ProgressFilter, build_log_records, build_rank_pods
from tests.helpers import IDENTITY, spec_from

ABORT_NONZERO = """\
[1,1]<stdout>:rank 1 up
[1,1]<stderr>:Traceback (most recent call last):
[1,1]<stderr>:ValueError: bad batch
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
mpiexec detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[36914,1],1]
  Exit code:    3
--------------------------------------------------------------------------""".splitlines()

SIGNALED = [
    "[1,2]<stdout>:working",
    "mpiexec noticed that process rank 2 with PID 0 on node job-worker-1 exited on signal 9 (Killed).",
]


def test_failed_rank_and_code_from_mpiexec() -> None:
    tracker = OutputTracker()
    tracker.feed(ABORT_NONZERO)
    assert (tracker.failed_rank, tracker.failed_exit_code) == (1, 3)
    assert tracker.rank_tail(1) == ["rank 1 up", "Traceback (most recent call last):", "ValueError: bad batch"]


def test_signaled_rank() -> None:
    tracker = OutputTracker()
    tracker.feed(SIGNALED)
    assert (tracker.failed_rank, tracker.failed_signal, tracker.failed_node) == (2, 9, "job-worker-1")


def test_mpi_abort_rank_and_code() -> None:
    tracker = OutputTracker()
    tracker.feed(
        [
            "[1,1]<stderr>:ValueError: bad batch",
            "--------------------------------------------------------------------------",
            "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD",
            "with errorcode 1.",
        ]
    )
    assert (tracker.failed_rank, tracker.failed_exit_code) == (1, 1)


HYDRA_ABORT = "Abort(3) on node 2 (rank 2 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 3) - process 2"


def test_an_mpi_abort_under_hydra_names_the_rank_and_code_from_the_libraries_own_line() -> None:
    """MPICH and Intel MPI say it on the aborting rank's stderr (here tagged by the rank wrapper);
    Hydra then kills the wrapper before its own exit line."""
    tracker = OutputTracker(np=3)
    tracker.feed(["[1,2]<stdout>:about to fail", f"[1,2]<stderr>:{HYDRA_ABORT}"])
    assert (tracker.failed_rank, tracker.failed_exit_code) == (2, 3)
    untagged = OutputTracker(np=3)  # mpi.tag_output: false
    untagged.feed(["about to fail", HYDRA_ABORT])
    assert (untagged.failed_rank, untagged.failed_exit_code) == (2, 3)


def test_a_rank_cannot_speak_for_another_ranks_abort() -> None:
    tracker = OutputTracker(np=3)
    tracker.feed([f"[1,1]<stderr>:{HYDRA_ABORT}"])
    assert tracker.failed_rank is None and tracker.failed_exit_code is None


def test_timeout_is_recognized() -> None:
    tracker = OutputTracker()
    tracker.feed(["The user-provided time limit for job execution has been reached:"])
    assert tracker.timed_out


def test_result_from_lowest_rank_and_bad_json_reported() -> None:
    tracker = OutputTracker()
    tracker.feed(
        [
            '[1,1]<stdout>:AIRFLOW_MPI_RESULT {"acc": 0.5}',
            '[1,0]<stdout>:AIRFLOW_MPI_RESULT {"acc": 0.9}',
            "[1,2]<stdout>:AIRFLOW_MPI_RESULT {not json",
        ]
    )
    assert tracker.result == {"acc": 0.9}
    (error,) = tracker.result_errors
    assert error.startswith("rank 2: its AIRFLOW_MPI_RESULT line is not JSON (Expecting property name")
    assert "json.dumps(value)" in error  # the fix


def test_oversized_and_cut_results_are_refused_naming_the_rank_and_the_limit() -> None:
    big = json.dumps({"w": "x" * RESULT_MAX_BYTES})
    tracker = OutputTracker()
    tracker.feed(
        [
            f"[1,3]<stdout>:AIRFLOW_MPI_RESULT {big}",
            "[1,4]<stdout>:AIRFLOW_MPI_RESULT {" + '"w": "' + "y" * 100 + CUT_MARK,
            'AIRFLOW_MPI_RESULT {"untagged": true}',
        ]
    )
    assert tracker.result is None  # no rank 0 result; untagged text is no rank's once ranks are tagged
    size_error, cut_error = tracker.result_errors
    assert size_error.startswith(f"rank 3: its AIRFLOW_MPI_RESULT line holds {len(big)} bytes, over the 32 KiB")
    assert cut_error.startswith("rank 4: its AIRFLOW_MPI_RESULT line was cut at the 64 KiB line cap")
    exact = json.dumps("z" * (RESULT_MAX_BYTES - 2))  # exactly the limit is fine
    tracker.feed([f"[1,0]<stdout>:AIRFLOW_MPI_RESULT {exact}"])
    assert tracker.result == "z" * (RESULT_MAX_BYTES - 2)


def test_refused_results_are_counted_past_the_ones_described() -> None:
    tracker = OutputTracker()
    tracker.feed(f"[1,{rank}]<stdout>:AIRFLOW_MPI_RESULT nope" for rank in range(12))
    assert len(tracker.result_errors) == 5 and tracker.result_error_count == 12
    assert tracker.result is None


def test_a_bar_updated_100k_times_in_10_seconds_shows_11_states_and_the_last() -> None:
    bars = ProgressFilter(interval=1.0)
    shown = []
    for i in range(1, 100_001):
        state = PartialLine(f"[1,0]<stderr>:\r{i}/100000") if i < 100_000 else "[1,0]<stderr>:\r100000/100000"
        shown += bars.feed([state], now=i / 10_000)
        shown += bars.due(now=i / 10_000)
    shown += bars.flush()
    assert len(shown) <= 12 and shown[0] == "[1,0]<stderr>:1/100000"
    assert shown[-1] == "[1,0]<stderr>:100000/100000"
    assert all("\r" not in line for line in shown)


def test_a_held_state_comes_before_the_ranks_next_line_and_other_ranks_pass() -> None:
    bars = ProgressFilter(interval=1.0)
    assert bars.feed(["[1,0]<stderr>:\r1%"], now=0.0) == ["[1,0]<stderr>:1%"]
    assert bars.feed(["[1,0]<stderr>:\r2%", "[1,1]<stdout>:other rank"], now=0.1) == ["[1,1]<stdout>:other rank"]
    assert bars.due(now=0.5) == []
    assert bars.feed(["[1,0]<stderr>:done"], now=0.6) == ["[1,0]<stderr>:2%", "[1,0]<stderr>:done"]
    assert bars.feed(["[1,0]<stderr>:\r9%"], now=0.7) == []
    assert bars.due(now=1.2) == []  # 0.6 s since 2% was shown
    assert bars.due(now=1.6) == ["[1,0]<stderr>:9%"]
    assert bars.feed(["untagged\rprogress"], now=2.0) == ["untagged\rprogress"]  # "\r" not first: a plain line
    # The rank's last state comes before its next line on stdout too (tqdm on stderr, print on stdout).
    assert bars.feed(["[1,0]<stderr>:\r100%"], now=2.1) == []
    assert bars.feed(["[1,0]<stdout>:training done"], now=2.2) == ["[1,0]<stderr>:100%", "[1,0]<stdout>:training done"]


def test_memory_stays_bounded() -> None:
    tracker = OutputTracker(tail_lines=10, rank_tail_lines=5)
    tracker.feed(f"[1,{i % 4}]<stdout>:line {i}" for i in range(100_000))
    assert tracker.lines_seen == 100_000
    assert len(tracker.tail) == 10 and all(len(tracker.rank_tail(r)) == 5 for r in range(4))


def test_log_records_coalesce_batches() -> None:
    lines = [f"l{i}" for i in range(12_001)]
    records = list(build_log_records(lines, max_lines=5000))
    assert [r.count("\n") + 1 for r in records] == [5000, 5000, 2001]
    assert "\n".join(records) == "\n".join(lines)


def test_rank_placement_by_slot_node_and_npernode() -> None:
    job = build_job_name("job", IDENTITY)
    spec = spec_from(master={"cpu": 2}, workers={"replicas": 2, "cpu": 2})
    topology = build_topology(spec, job)
    m, w0, w1 = topology.pods
    assert build_rank_pods(spec, topology) == [m, m, w0, w0, w1, w1]
    spec = spec_from(master={"cpu": 2}, workers={"replicas": 2, "cpu": 2}, mpi={"map_by": "node"})
    assert build_rank_pods(spec, build_topology(spec, job)) == [m, w0, w1, m, w0, w1]
    spec = spec_from(master={"cpu": 2}, workers={"replicas": 2, "cpu": 2}, mpi={"npernode": 1, "np": 3})
    assert build_rank_pods(spec, build_topology(spec, job)) == [m, w0, w1]


def test_open_mpi_5_names_the_failed_process_in_prrtes_form() -> None:
    tracker = OutputTracker()
    tracker.feed(
        [
            "[1,1]<stdout>:about to fail",
            "prterun detected that one or more processes exited with non-zero status,",
            "thus causing the job to be terminated. The first process to do so was:",
            "",
            "   Process name: [prterun-job-master-0-412@1,1]",
            "   Exit code:    3",
        ]
    )
    assert (tracker.failed_rank, tracker.failed_exit_code) == (1, 3)


def test_the_hydra_rank_wrappers_exit_line_names_its_rank_code_and_host() -> None:
    tracker = OutputTracker(np=3)
    tracker.feed(
        [
            "[1,2]<stdout>:AIRFLOW_MPI_RANK_EXIT rank=1 code=3 host=job-worker-0",  # rank 2's text: not its own
            "[1,1]<stderr>:AIRFLOW_MPI_RANK_EXIT rank=1 code=137 host=job-worker-0",
            "[mpiexec@job-master-0] control_cb (pm/pmiserv/pmiserv_cb.c:206): assert (!closed) failed",
        ]
    )
    assert (tracker.failed_rank, tracker.failed_signal, tracker.failed_node) == (1, 9, "job-worker-0")
    assert tracker.failed_exit_code is None


def test_an_untagged_hydra_rank_exit_line_still_names_the_rank_and_code() -> None:
    tracker = OutputTracker(np=3)  # tag_output: false: no line carries a rank tag
    tracker.feed(["training", "AIRFLOW_MPI_RANK_EXIT rank=2 code=3 host=job-worker-1", "AIRFLOW_MPI_RANK_EXIT x"])
    assert (tracker.failed_rank, tracker.failed_exit_code, tracker.failed_node) == (2, 3, "job-worker-1")
