"""Where a retry looks for the jobs its earlier tries left, and where it removes them."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_mpi.backends.base import FoundJob
from airflow_mpi.exceptions import JobNotFound
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.runner.retries import find_earlier_jobs, resume_or_clean
from tests.helpers import spec_from

RETRY = RunIdentity("d", "t", "r", try_number=3, deployment="staging")


class Cluster:
    """A ReattachableBackend whose namespaces hold jobs (``None``: the namespace is gone)."""

    name = "kubernetes"

    def __init__(self, jobs: dict[str, list[FoundJob] | None], default: str = "default") -> None:
        self.jobs, self.default, self.removed, self.asked = jobs, default, [], []

    def namespace_for(self, spec: Any) -> str:
        return spec.pod.namespace or self.default

    def find_jobs(self, identity: RunIdentity, namespace: str) -> list[FoundJob]:
        self.asked.append(namespace)
        if self.jobs.get(namespace, []) is None:
            raise JobNotFound(f"namespace {namespace} does not exist")
        return list(self.jobs.get(namespace) or [])

    def remove_found(self, found: FoundJob) -> list[str]:
        self.removed.append((found.namespace, found.job_name))
        return []

    def adopt(self, plan: Any, namespace: str) -> list[Any]:
        return []  # no master there: nothing to reattach to


# The rest of the Backend protocol: a retry must not reach for it.
for method in ("create", "probe_workers", "pod_states", "wait_for_change", "start_master", "follow_master",
               "pod_log_tail", "teardown", "leftovers", "release"):  # fmt: skip
    setattr(Cluster, method, lambda self, *a, m=method, **k: pytest.fail(f"{m} is not how a retry removes a job"))


def test_a_retry_removes_each_earlier_job_in_the_namespace_it_was_found_in() -> None:
    cluster = Cluster({"team-a": [FoundJob("x-aaaa", "team-a", 1)], "default": [FoundJob("x-bbbb", "default", 2)]})
    assert resume_or_clean(cluster, spec_from(), RETRY, ["team-a"]) is None  # type: ignore[arg-type]
    assert cluster.asked == ["team-a", "default"]  # the recorded namespace, then the spec's
    assert sorted(cluster.removed) == [("default", "x-bbbb"), ("team-a", "x-aaaa")]


def test_a_recorded_namespace_that_is_gone_is_passed_over_but_the_specs_own_is_not() -> None:
    spec = spec_from(pod={"namespace": "ml"})
    cluster = Cluster({"gone": None, "ml": [FoundJob("x-cccc", "ml", 2)]})
    assert [job.job_name for job in find_earlier_jobs(cluster, spec, RETRY, ["gone", "ml"])] == ["x-cccc"]  # type: ignore[arg-type]
    with pytest.raises(JobNotFound):
        find_earlier_jobs(Cluster({"ml": None}), spec, RETRY, [])  # type: ignore[arg-type]
