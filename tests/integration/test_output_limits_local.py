"""The master's output on the local backend, with real ranks behind real mpiexec: memory stays flat
whatever a rank prints (200 MB without a newline, a tqdm bar updated 100k times), the task log
stays readable, and a job whose ranks do not all start fails within its bound.

The memory tests run the operator in a process of its own (``tests.output_probe``).
Run under the machine-wide lock, one file at a time (see tests/integration/conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi import contract
from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.exceptions import JobFailed
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.observe.lines import CUT_MARK
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.faults import FaultRow

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
GROWTH_LIMIT_KB = 50 * 1024
RANK0 = "[1,0]<stdout>:"

FLOOD = """\
import sys
out = sys.stdout.buffer
for _ in range(200):  # 200 MiB, no newline
    out.write(b"#" * (1 << 20))
    out.flush()
print()
print("after the flood")
"""

BAR = """\
from tqdm import tqdm
for _ in tqdm(range(100_000), mininterval=0, miniters=1):  # every update printed
    pass
print("training done")
"""


def probe(state_root: Path, log: Path, command: list[str]) -> dict[str, Any]:
    """Run a one-rank job in an operator process of its own; its report (RSS in KiB, lines)."""
    spec = json.dumps({"name": "lout", "command": command})
    argv = ["--backend=local", f"--state-dir={state_root}", f"--spec={spec}", f"--log={log}"]
    done = subprocess.run(
        [PY, "-m", "tests.output_probe", *argv], capture_output=True, text=True, timeout=600, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    print(f"operator: {report}")  # the figures for docs/figures.md (pytest -s)
    return report


def test_200_mb_without_a_newline_keep_the_operator_flat(
    backend: LocalBackend, state_root: Path, tmp_path: Path
) -> None:
    report = probe(state_root, tmp_path / "task.log", [PY, "-c", FLOOD])
    assert report["error"] == "" and report["growth_kb"] < GROWTH_LIMIT_KB, report
    lines = (tmp_path / "task.log").read_text().split("\n")
    assert [line for line in lines if line.startswith(RANK0 + "#")] == [RANK0 + "#" * 65536 + CUT_MARK]
    assert f"{RANK0}after the flood" in lines


def test_a_tqdm_bar_updated_100k_times_shows_about_one_state_a_second_and_the_last(
    backend: LocalBackend, state_root: Path, tmp_path: Path
) -> None:
    pytest.importorskip("tqdm")  # the real thing (installed with DeepSpeed, the demo extra); ranks run this Python
    report = probe(state_root, tmp_path / "task.log", [PY, "-c", BAR])
    assert report["error"] == "" and report["growth_kb"] < GROWTH_LIMIT_KB, report
    lines = (tmp_path / "task.log").read_text().split("\n")
    states = [line for line in lines if line.startswith("[1,0]<stderr>:") and "/100000" in line]
    # One state a second from the first, the state held back when the bar's final line comes, and
    # that final line: at most seconds + 3.
    assert 1 <= len(states) <= report["seconds"] + 3, states
    assert "100000/100000" in states[-1] and states[-1].startswith("[1,0]<stderr>:100%|")
    assert not any("\r" in line for line in lines)
    assert f"{RANK0}training done" in lines


def make_plan(**fields: Any) -> JobPlan:
    data: dict[str, Any] = {"name": "lws", "master": {"cpu": 2}, "workers": {"replicas": 1, "cpu": 2}}
    data.update(fields)
    return render_plan(MPIJobSpec.from_dict(data), RunIdentity("lws", "train", f"r-{time.time_ns()}"))


def run_failing(backend: LocalBackend, plan: JobPlan) -> tuple[JobFailed, float, list[str]]:
    shown: list[str] = []
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, lambda text: shown.extend(text.splitlines())).run()
    return caught.value, time.monotonic() - started, shown


@pytest.mark.fault
def test_ranks_that_hang_before_they_start_fail_the_job_naming_their_pod(
    backend: LocalBackend, shared_dir: Path, fault_row: FaultRow
) -> None:
    """Ranks 2 and 3 (the worker's) block in a shell startup file, before the wrapper runs."""
    startup = shared_dir / "bash_env.sh"
    startup.write_text('if [ "${OMPI_COMM_WORLD_RANK:-0}" -ge 2 ]; then sleep 600; fi\n')
    plan = make_plan(command=[PY, "-c", "print('rank up')"], env={"BASH_ENV": str(startup)}, startup_timeout=5)
    error, seconds, shown = run_failing(backend, plan)
    left = backend.leftovers(plan.job_name)
    fault_row("ranks hang before they start", "local", "waiting", "failed", seconds, str(error), left)
    assert str(error).startswith(
        f"MPI job {plan.job_name} failed: 2 of 4 ranks started within 5 s of mpiexec's start; "
        f"missing rank(s) 2-3 expected on pod {plan.workers[0].name}."
    )
    assert error.rank == 2 and error.pod == plan.workers[0].name
    assert seconds < 30 and left == []
    assert not any("AIRFLOW_MPI_RANK_START" in line for line in shown)


@pytest.mark.fault
def test_a_world_size_other_than_the_plans_fails_at_once(backend: LocalBackend, fault_row: FaultRow) -> None:
    """The master pod's env no longer matches the plan (as if changed by hand): mpiexec runs 2
    ranks where the plan has 4."""
    plan = make_plan(command=["sleep", "60"])
    master = dataclasses.replace(plan.master, env={**plan.master.env, contract.ENV_NP_OVERRIDE: "2"})
    plan = dataclasses.replace(plan, pods=(master, *plan.workers))
    error, seconds, _ = run_failing(backend, plan)
    left = backend.leftovers(plan.job_name)
    fault_row("world size other than the plan's", "local", "waiting", "failed", seconds, str(error), left)
    assert "failed: mpiexec started 2 rank(s) but the job has 4: rank " in str(error)
    assert seconds < 20 and left == []  # the ranks sleep 60 s: the check ended the job


def test_every_rank_started_is_one_line(backend: LocalBackend) -> None:
    plan = make_plan(command=["true"])
    shown: list[str] = []
    JobRunner(backend, plan, lambda text: shown.extend(text.splitlines())).run()
    started = [line for line in shown if "rank(s) started" in line]
    master, worker = plan.master.name, plan.workers[0].name
    assert len(started) == 1 and started[0].endswith(f": 0-1 on {master}, 2-3 on {worker}")
    assert "[airflow-mpi] starting mpiexec: 4 rank(s)" in shown
    assert not any("AIRFLOW_MPI_RANK_START" in line for line in shown)
