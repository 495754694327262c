"""The local backend and input it cannot honour: a GPU spec runs on CPUs and says so in the task
log; a spec or a volume it refuses creates nothing at all."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.exceptions import SpecError
from airflow_mpi.runner.job import JobRunner
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


def test_a_script_under_tmp_is_refused_before_anything_is_created(backend: LocalBackend, state_root: Path) -> None:
    """Every local pod gets an empty private /tmp: a script there would be 'not found' on every rank."""
    import tempfile

    with tempfile.NamedTemporaryFile(dir="/tmp", suffix=".py") as script:
        plan = make_plan(["python", script.name, "--data", "/tmp/not-a-file-check"])
        with pytest.raises(SpecError) as caught:
            JobRunner(backend, plan, Log()).run()
    assert caught.value.fields == ("command[1]",)  # only paths that exist here are flagged
    assert "move the file elsewhere, e.g. /var/tmp/" in str(caught.value)
    assert not (state_root / plan.job_name).exists() and ours() == []


def test_python_or_state_dir_under_tmp_is_named_as_a_missing_prerequisite() -> None:
    from airflow_mpi.backends.local import check_prerequisites

    assert not [p for p in check_prerequisites() if "/tmp" in p]  # this checkout's venv is fine
    [python] = [p for p in check_prerequisites("/tmp/clone/.venv/bin:/usr/bin") if "/tmp" in p]
    assert "/tmp/clone/.venv/bin" in python and "install the virtualenv elsewhere" in python
    [state] = [p for p in check_prerequisites(state_dir=Path("/tmp/state")) if "/tmp" in p]
    assert state.startswith("a state_dir outside /tmp: /tmp/state")
    assert not [p for p in check_prerequisites("/tmpfoo/bin", Path("/var/tmp/s")) if "tmp" in p]


def test_a_command_in_an_mca_value_starts_nothing(backend: LocalBackend, state_root: Path) -> None:
    """Open MPI would hand the value to a shell on every worker: the spec is refused when the plan
    is rendered, before the backend creates anything; a plain value runs the same job."""
    import os
    import time

    from airflow_mpi.job.naming import RunIdentity
    from airflow_mpi.job.plan import render_plan
    from airflow_mpi.spec import MPIJobSpec, MPIOptions, WorkerSpec

    marker = Path("/var/tmp") / f"airflow-mpi-mca-{os.getpid()}-{time.time_ns()}"
    spec = MPIJobSpec(  # built in Python, never through from_dict: the plan validates it itself
        name="itest",
        command=("true",),
        workers=WorkerSpec(replicas=1),
        mpi=MPIOptions(mca={"btl_base_verbose": f"0;touch {marker}"}, extra_args=("-x", "MPI_NP=99")),
    )
    with pytest.raises(SpecError) as caught:
        JobRunner(backend, render_plan(spec, RunIdentity("itest", "train", f"mca-{time.time_ns()}")), Log()).run()
    assert set(caught.value.fields) == {"mpi.mca.btl_base_verbose", "mpi.extra_args[1]"}
    assert not marker.exists() and ours() == []
    assert [p.name for p in state_root.iterdir() if p.name != ".lock"] == []
    plan = make_plan(["true"], workers={"replicas": 1}, mpi={"mca": {"btl_base_verbose": "0"}})
    assert JobRunner(backend, plan, Log()).run().exit_code == 0
    assert not marker.exists()
