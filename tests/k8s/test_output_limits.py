"""The master's output on the Kubernetes backend, against the API double's scripted master: memory
stays flat whatever a rank prints (200 MB without a newline, a bar rewritten 100k times), the task
log stays readable, results are never silently lost, and a job whose ranks do not all start fails.

The memory tests run the operator in a process of its own (``tests.output_probe``): the double,
in this process, keeps the whole log, as a kubelet would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_mpi.backends.kubernetes import KubernetesBackend
from airflow_mpi.exceptions import JobFailed
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import JobPlan, render_plan
from airflow_mpi.observe.lines import CUT_MARK
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec
from tests.doubles.kube_double import KubeDouble, PodScript
from tests.faults import FaultRow
from tests.k8s.conftest import Scripts, job_objects, unique

REPO = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = {
    "name": "kout",
    "image": "registry.example/train:1",
    "command": ["python", "/app/train.py"],
    "master": {"cpu": 2},
    "workers": {"replicas": 1, "cpu": 2},
}
GROWTH_LIMIT_KB = 50 * 1024
RANK0 = "[1,0]<stdout>:"
BAR = "[1,0]<stderr>:"


def probe(double: KubeDouble, log: Path, **fields: Any) -> dict[str, Any]:
    """Run one job in an operator process of its own; its report (RSS in KiB, lines written)."""
    spec = json.dumps({**SPEC, **fields})
    argv = ["--backend=kubernetes", f"--url={double.url}", f"--spec={spec}", f"--log={log}"]
    done = subprocess.run(
        [sys.executable, "-m", "tests.output_probe", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    print(f"operator: {report}")  # the figures for docs/figures.md (pytest -s)
    return report


def flood() -> Iterator[str]:
    """200 MiB from rank 0 without a newline, as mpiexec prints it: a tag on each 4 KiB piece."""
    block = (RANK0 + "#" * 4082) * 256  # 1 MiB a write
    for _ in range(200):
        yield block
    yield f"\n{RANK0}after the flood\n"


def test_200_mb_without_a_newline_keep_the_operator_flat(double: KubeDouble, scripts: Scripts, tmp_path: Path) -> None:
    scripts.on("-master-", PodScript(writes=flood, exit_code=0))
    report = probe(double, tmp_path / "task.log")
    assert report["error"] == ""
    assert report["growth_kb"] < GROWTH_LIMIT_KB, report
    lines = (tmp_path / "task.log").read_text().splitlines()
    cut = [line for line in lines if line.startswith(RANK0 + "#")]
    assert cut == [RANK0 + "#" * 65536 + CUT_MARK]  # one line, cut at 64 KiB, marked
    assert f"{RANK0}after the flood" in lines and lines[-1].endswith("succeeded")
    assert job_objects(double) == []


def bar() -> Iterator[str]:
    """A tqdm-style bar on rank 0's stderr, 100k updates over ~4 s, each its own tagged piece."""
    for start in range(0, 100_000, 1000):
        yield "".join(f"{BAR}\r{i:>6}/100000 |{'#' * (i // 5000):<20}|" for i in range(start + 1, start + 1001))
        time.sleep(0.04)
    yield f"{BAR}\n{RANK0}training done\n"


def test_a_bar_updated_100k_times_shows_about_one_state_a_second_and_the_last(
    double: KubeDouble, scripts: Scripts, tmp_path: Path
) -> None:
    scripts.on("-master-", PodScript(writes=bar, exit_code=0))
    report = probe(double, tmp_path / "task.log")
    assert report["error"] == "" and report["growth_kb"] < GROWTH_LIMIT_KB, report
    lines = (tmp_path / "task.log").read_text().splitlines()
    states = [line for line in lines if line.startswith(BAR) and "/100000" in line]
    assert 2 <= len(states) <= report["seconds"] + 2, states
    assert states[-1] == f"{BAR}100000/100000 |####################|"
    assert all("\r" not in line for line in lines)
    assert f"{RANK0}training done" in lines and len(lines) < 30


def make_plan(**fields: Any) -> JobPlan:
    return render_plan(MPIJobSpec.from_dict({**SPEC, **fields}), RunIdentity("kdag", "train", unique("run")))


class Log(list[str]):
    def __call__(self, text: str) -> None:
        self.extend(text.splitlines())


def test_a_malformed_result_is_a_warning_naming_the_rank(backend: KubernetesBackend, scripts: Scripts) -> None:
    output = [
        f"{RANK0}step 1",
        "[1,1]<stdout>:AIRFLOW_MPI_RESULT {'loss': 0.1}",
        f'{RANK0}AIRFLOW_MPI_RESULT {{"loss": 0.2}}',
    ]
    scripts.on("-master-", PodScript(lines=lambda: iter(output), exit_code=0))
    log, warnings = Log(), Log()
    result = JobRunner(backend, make_plan(), log, warn=warnings).run()
    assert result.result == {"loss": 0.2}
    (warning,) = warnings
    assert warning.startswith("airflow-mpi: WARNING: rank 1: its AIRFLOW_MPI_RESULT line is not JSON (Expecting")


def test_a_long_result_in_pieces_survives_dropped_streams(
    backend: KubernetesBackend, double: KubeDouble, scripts: Scripts
) -> None:
    """A 20 kB result that mpiexec prints in 4 KiB pieces, another rank writing in between, the log
    stream cut after every 2 entries 6 times: the result line is whole, and shown once."""
    text = f'AIRFLOW_MPI_RESULT {{"weights": {list(range(4000))}}}\n'
    pieces = [RANK0 + text[start : start + 4096] for start in range(0, len(text), 4096)]
    pieces.insert(2, "[1,1]<stderr>:\r50%")

    scripts.on("-master-", PodScript(writes=lambda: iter(pieces), exit_code=0))
    double.drop_log_streams(after_lines=2, times=6)
    log = Log()
    result = JobRunner(backend, make_plan(), log).run()
    assert result.result == {"weights": list(range(4000))}
    assert [line for line in log if "AIRFLOW_MPI_RESULT" in line] == [RANK0 + text.rstrip("\n")]
    assert "[1,1]<stderr>:50%" in log  # the other rank's bar, its last state, at the end


def rank_starts(plan: JobPlan, size: int, ranks: range) -> list[str]:
    """The rank wrapper's first lines: ranks 0-1 on the master, 2-3 on the worker."""
    hosts = [plan.master.name] * 2 + [plan.workers[0].name] * 2
    return [f"[1,{r}]<stdout>:AIRFLOW_MPI_RANK_START rank={r} size={size} host={hosts[r]}" for r in ranks]


@pytest.mark.fault
@pytest.mark.parametrize(
    ("case", "size", "ranks", "expected"),
    [
        ("2 of 4 ranks never start", 4, range(2), "2 of 4 ranks started within 2 s of mpiexec's start"),
        ("mpiexec runs 2 ranks, the plan 4", 2, range(2), "mpiexec started 2 rank(s) but the job has 4"),
    ],
)
def test_ranks_that_do_not_all_start_fail_the_job_and_nothing_is_left(
    backend: KubernetesBackend,
    double: KubeDouble,
    scripts: Scripts,
    fault_row: FaultRow,
    case: str,
    size: int,
    ranks: range,
    expected: str,
) -> None:
    plan = make_plan(startup_timeout=2)
    reports = rank_starts(plan, size, ranks)
    output = ["MPI_NP=4", "[airflow-mpi] starting mpiexec: 4 rank(s)", *reports, f"{RANK0}waiting for the others"]
    scripts.on("-master-", PodScript(lines=lambda: iter(output)))  # then hangs, as a blocked job would
    log = Log()
    started = time.monotonic()
    with pytest.raises(JobFailed) as caught:
        JobRunner(backend, plan, log).run()
    seconds = time.monotonic() - started
    left = job_objects(double, plan.job_name)
    fault_row(case, "kubernetes", "waiting", "failed", seconds, str(caught.value), left)
    assert expected in str(caught.value) and left == []
    if size == 4:
        assert f"missing rank(s) 2-3 expected on pod {plan.workers[0].name}" in str(caught.value)
        assert 2.0 <= seconds < 10.0
    else:
        assert seconds < 5.0  # at once, not at the deadline
    assert not any("AIRFLOW_MPI_RANK_START" in line for line in log)
