"""The deferred log follow's budget: a job within its rate reads on at once; past it, it waits
as long as its excess takes at the rate (its lines lag, none dropped)."""

from __future__ import annotations

from airflow_mpi.triggers.logfollow import TokenBucket, build_mark


def test_within_the_rate_no_wait_past_it_the_excess_over_the_rate() -> None:
    bucket = TokenBucket(rate=1000, burst=1000)
    assert bucket.delay(600, now=0.0) == 0.0
    assert bucket.delay(400, now=0.0) == 0.0
    assert bucket.delay(500, now=0.0) == 0.5  # 500 bytes over: half a second at 1000/s
    assert bucket.delay(0, now=1.5) == 0.0  # paid back, and 1000 saved at most
    assert bucket.delay(1500, now=1.5) == 0.5


def test_a_quiet_job_saves_at_most_its_burst() -> None:
    bucket = TokenBucket(rate=100, burst=200)
    assert bucket.delay(0, now=0.0) == 0.0
    assert bucket.delay(300, now=100.0) == 1.0  # a long quiet spell saved 200, not 10000


def test_the_mark_names_the_master_log_and_the_lines_read() -> None:
    assert build_mark(1250) == "airflow_mpi.master:1250"
