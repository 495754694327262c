"""The world-size check: every rank reports on start, on the pod the plan says, within a bounded
time of mpiexec's start; a wrong world size fails at once; the reports fold into one line."""

from __future__ import annotations

from airflow_mpi.observe.output import build_rank_pods
from airflow_mpi.observe.worldsize import RANK_START_TIMEOUT, RankStartCheck, format_ranks, rank_start_timeout
from tests.helpers import plan_for, spec_from

PLAN = plan_for(spec_from(master={"cpu": 2}, workers={"replicas": 1, "cpu": 2}, startup_timeout=60))
MASTER, WORKER = PLAN.master.name, PLAN.workers[0].name
START = "[airflow-mpi] starting mpiexec: 4 rank(s)"


def check() -> RankStartCheck:
    return RankStartCheck(
        np=PLAN.topology.np,
        rank_pods=build_rank_pods(PLAN.spec, PLAN.topology),
        job_pods=[p.name for p in PLAN.pods],
        timeout=rank_start_timeout(PLAN.spec),
    )


def report(rank: int, host: str, size: int = 4, tagged: bool = True) -> str:
    line = f"AIRFLOW_MPI_RANK_START rank={rank} size={size} host={host}"
    return f"[1,{rank}]<stdout>:{line}" if tagged else line


def test_every_rank_on_its_pod_folds_into_one_line() -> None:
    ranks = check()
    kept = ranks.feed(["MPI_NP=4", START, report(0, MASTER), report(1, MASTER), "[1,0]<stdout>:hello"], now=10.0)
    assert kept == ["MPI_NP=4", START, "[1,0]<stdout>:hello"]  # the reports are not shown
    assert ranks.summary() is None and ranks.problem(now=11.0) is None
    assert ranks.feed([report(2, WORKER), report(3, WORKER, tagged=False)], now=10.4) == []
    assert ranks.problem(now=1000.0) is None
    assert ranks.summary() == f"airflow-mpi: all 4 rank(s) started within 0.4 s: 0-1 on {MASTER}, 2-3 on {WORKER}"
    assert ranks.summary() is None  # once


def test_ranks_missing_at_the_deadline_are_named_with_their_pod() -> None:
    ranks = check()
    ranks.feed([START, report(0, MASTER), report(1, MASTER)], now=100.0)
    assert ranks.timeout == 60.0 and ranks.problem(now=159.9) is None
    problem = ranks.problem(now=160.0)
    assert problem is not None
    assert problem.startswith(
        f"2 of 4 ranks started within 60 s of mpiexec's start; missing rank(s) 2-3 expected on pod {WORKER}."
    )
    assert "docs/contract.md#rank-start" in problem
    assert ranks.missing_ranks() == [2, 3]


def test_no_deadline_before_mpiexec_starts_but_an_end_without_every_rank_fails() -> None:
    ranks = check()
    ranks.feed([report(0, MASTER)], now=0.0)
    assert ranks.problem(now=10_000.0) is None  # the launch script never said it starts mpiexec
    ranks.feed([START], now=1.0)
    problem = ranks.problem(now=2.0, ended=True)
    assert problem is not None and problem.startswith("1 of 4 ranks started before mpiexec ended; missing rank(s) 1")


def test_a_wrong_world_size_fails_at_once() -> None:
    ranks = check()
    ranks.feed([START, report(0, MASTER, size=2)], now=0.0)
    problem = ranks.problem(now=0.0)
    assert problem is not None
    assert problem.startswith(
        f"mpiexec started 2 rank(s) but the job has 4: rank 0 on {MASTER} reports a world size of 2."
    )


def test_a_rank_on_no_pod_of_the_job_fails() -> None:
    ranks = check()
    ranks.feed([START, report(1, "some-other-host")], now=0.0)
    problem = ranks.problem(now=0.0)
    assert problem is not None and problem.startswith("rank 1 started on some-other-host, which is no pod of this job")


def test_another_placement_is_noted_not_failed() -> None:
    ranks = check()
    ranks.feed([START] + [report(rank, MASTER if rank % 2 == 0 else WORKER) for rank in range(4)], now=0.0)
    assert ranks.problem(now=1000.0) is None
    summary = ranks.summary() or ""
    assert summary.endswith(f"0,2 on {MASTER}, 1,3 on {WORKER}")  # same count per pod: no note
    moved = check()
    moved.feed([START] + [report(rank, MASTER if rank < 3 else WORKER) for rank in range(4)], now=0.0)
    assert (moved.summary() or "").endswith(
        f"(the plan puts 2 on {MASTER}, 2 on {WORKER}: mpi.extra_args may change the mapping)"
    )


def test_the_timeout_is_startup_timeout_at_most_120_s() -> None:
    assert rank_start_timeout(spec_from(startup_timeout=30)) == 30.0
    assert rank_start_timeout(spec_from(startup_timeout=900)) == RANK_START_TIMEOUT == 120.0


def test_rank_lists_are_compact() -> None:
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ranks([3]) == "3" and format_ranks([]) == ""
