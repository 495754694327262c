"""The local backend and input it cannot honour: a GPU spec runs on CPUs and says so in the task
log; a spec or a volume it refuses creates nothing at all."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.exceptions import SpecError
from airflow_mpi.runner import JobRunner
from tests.integration.test_local_backend import Log, make_plan
from tests.leaks import ours


def test_a_gpu_spec_runs_on_cpus_and_the_log_says_so(backend: LocalBackend, caplog: pytest.LogCaptureFixture) -> None:
    plan = make_plan(
        ["bash", "-c", 'echo "rank $RANK of $WORLD_SIZE"'], master={"gpus": 2}, workers={"replicas": 1, "gpus": 2}
    )
    log = Log()
    with caplog.at_level(logging.WARNING, logger="airflow_mpi.backends.local"):
        result = JobRunner(backend, plan, log).run()
    assert result.np == 4  # slots follow the GPU counts: 2 pods x 2 GPUs, as on Kubernetes
    assert sorted(line.split(":", 1)[1] for line in log.lines if line.startswith("[1,")) == [
        f"rank {r} of 4" for r in range(4)
    ]
    [warning] = [r.getMessage() for r in caplog.records if r.name == "airflow_mpi.backends.local"]
    assert warning == (
        "the local backend has no GPUs: ranks run on CPUs; slots follow the GPU counts (master 2, workers 2 per "
        f"pod), so job {plan.job_name} runs 4 rank(s) on the hosts Kubernetes would give it"
    )


def test_a_cpu_spec_gets_no_gpu_warning(backend: LocalBackend, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="airflow_mpi.backends.local"):
        JobRunner(backend, make_plan(["true"], workers={"replicas": 0}), Log()).run()
    assert not [r for r in caplog.records if "GPU" in r.getMessage()]


def test_a_volume_the_local_backend_cannot_mount_creates_nothing(backend: LocalBackend, state_root: Path) -> None:
    volume = {"name": "data", "mount_path": "/data", "persistent_volume_claim": "claim"}
    plan = make_plan(["true"], pod={"volumes": [volume, {"name": "gone", "mount_path": "/g", "host_path": "/no/such"}]})
    with pytest.raises(SpecError) as caught:
        JobRunner(backend, plan, Log()).run()
    assert set(caught.value.fields) == {"pod.volumes[0]", "pod.volumes[1].host_path"}
    assert not (state_root / plan.job_name).exists() and ours() == []
