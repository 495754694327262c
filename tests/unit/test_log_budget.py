"""The deferred log follow's budget: a job within its rate reads on at once; past it, it waits
as long as its excess takes at the rate (its lines lag, none dropped)."""

from __future__ import annotations

import pytest

from airflow_mpi.triggers.logfollow import JOB_FLOOR_BYTES_PER_S, SLOW_WRITE_S, LogBudget, TokenBucket, build_mark


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


def test_a_slow_write_halves_every_jobs_rate_which_grows_back() -> None:
    budget = LogBudget(job_rate=512 * 1024)
    budget.wrote(SLOW_WRITE_S / 2, now=10.0)
    assert budget._job_rate(10.0) == 512 * 1024  # a quick write: the channel keeps up
    budget.wrote(SLOW_WRITE_S, now=10.0)  # the triggerer's supervisor is behind
    assert budget._job_rate(10.0) == 256 * 1024
    budget.wrote(0.5, now=10.0)
    assert budget._job_rate(10.0) == 128 * 1024
    assert budget._job_rate(11.0) == pytest.approx(160 * 1024)  # a quarter a second back
    assert budget._job_rate(60.0) == 512 * 1024  # never above the job's own rate
    for _ in range(20):
        budget.wrote(1.0, now=70.0)
    assert budget._job_rate(70.0) == JOB_FLOOR_BYTES_PER_S  # a job's lines still move


def test_a_flooding_job_waits_longer_once_the_channel_is_slow() -> None:
    budget = LogBudget(job_rate=1000, process_rate=10**9)
    flood = budget.for_job()
    assert flood(1000) == 0.0  # its burst
    before = flood(1000)
    budget.wrote(1.0)
    assert flood(1000) > before + 0.9  # at half the rate its next second of bytes takes two
