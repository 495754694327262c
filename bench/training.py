"""Training throughput under the operator's path against bare mpiexec (local backend).

The example's DeepSpeed training (dags/scripts/train_digits.py, the demo's job: 1 master + 2
workers, 1 rank each, OMP_NUM_THREADS=1, btl tcp,self) runs through the job runner, then the same
script runs under a bare ``mpiexec -np 3`` over the same pods, hosts and ssh configuration, with
torch.distributed's variables set from Open MPI's as any mpiexec user would. Rank 0 reports the
optimizer steps per second of its training loop (launch and imports excluded); the figure is the
ratio, runs interleaved so that the machine's load drifts into both alike (no warm-up run: the
loop's clock starts after the imports and DeepSpeed's setup).

    sudo .venv/bin/python bench/training.py [--epochs 40] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _state import STATE_DIR, remove_state_dir
from launch_overhead import _master_init, _quietly

from airflow_mpi.backends.local import LocalBackend
from airflow_mpi.job.naming import RunIdentity
from airflow_mpi.job.plan import render_plan
from airflow_mpi.job.topology import render_mpi_hosts
from airflow_mpi.runner.job import JobRunner
from airflow_mpi.spec import MPIJobSpec

SCRIPT = Path(__file__).resolve().parent.parent / "dags" / "scripts" / "train_digits.py"
DATA = Path("/var/tmp/airflow-mpi-bench-train")
ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
RESULT = "AIRFLOW_MPI_RESULT "


def prepare_data() -> None:
    """The demo's preprocess step: scikit-learn's digits, the same 75/25 split."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    DATA.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    np.savez(DATA / "train.npz", x=x_train, y=y_train)
    np.savez(DATA / "test.npz", x=x_test, y=y_test)


def train_command(epochs: int) -> list[str]:
    """Every run trains from scratch: its own checkpoint directory, so none resumes another's."""
    checkpoints = DATA / f"checkpoints-{time.time_ns()}"
    return [
        sys.executable,
        str(SCRIPT),
        "--data",
        str(DATA),
        "--epochs",
        str(epochs),
        "--checkpoints",
        str(checkpoints),
    ]


def job_spec(command: list[str]) -> MPIJobSpec:
    return MPIJobSpec.from_dict(
        {
            "name": "train",
            "command": command,
            "workers": {"replicas": 2},
            "env": ENV,
            "mpi": {"btl": "tcp,self"},
            "timeout": 600,
            "pod": {"volumes": [{"name": "data", "host_path": str(DATA), "mount_path": str(DATA)}]},
        }
    )


def through_operator(backend: LocalBackend, epochs: int) -> dict[str, Any]:
    """One training job through the runner (what MPIJobOperator runs): rank 0's result."""
    plan = render_plan(job_spec(train_command(epochs)), RunIdentity("bench", "train", f"t-{time.time_ns()}"))
    result = JobRunner(backend, plan, lambda _text: None).run()
    if not isinstance(result.result, dict) or "steps_per_second" not in result.result:
        raise RuntimeError(f"the training job reported no steps_per_second: {result.result!r}")
    return result.result


class BarePods:
    """A job's pods held up (its master sleeps) to run plain mpiexec in the master pod."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.plan = render_plan(job_spec(["sleep", "900"]), RunIdentity("bench", "bare", f"b-{time.time_ns()}"))
        self.runner = JobRunner(backend, self.plan, lambda _text: None)
        self.thread = threading.Thread(target=lambda: _quietly(self.runner.run), daemon=True)

    def __enter__(self) -> BarePods:
        self.thread.start()
        deadline = time.monotonic() + 120
        while self.runner.output.lines_seen < 3 or not _master_init(self.backend, self.plan.job_name):
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("the bare-mpiexec pods did not start")
            time.sleep(0.05)
        time.sleep(1.0)  # let the job's own mpiexec finish starting its (sleeping) ranks
        return self

    def __exit__(self, *_: object) -> None:
        self.runner.teardown()
        self.thread.join(30)

    def train(self, epochs: int) -> dict[str, Any]:
        """The same script under ``mpiexec -np 3``: same hosts, ssh config, btl and env."""
        topology = self.plan.topology
        ranks_env = (
            "RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE "
            'LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK exec "$@"'
        )
        argv = [
            "nsenter", "-t", str(_master_init(self.backend, self.plan.job_name)), "-a",
            "mpiexec", "--allow-run-as-root", "--host", render_mpi_hosts(topology), "-np", str(topology.np),
            "--mca", "orte_keep_fqdn_hostnames", "1",
            "--mca", "plm_rsh_args", f"-F {self.plan.paths.ssh_config}",
            "--mca", "btl", "tcp,self",
            *[arg for name, value in ENV.items() for arg in ("-x", f"{name}={value}")],
            "-x", f"MASTER_ADDR={topology.rank0_host}", "-x", "MASTER_PORT=29500",
            "bash", "-c", ranks_env, "rank", *train_command(epochs),
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
        found = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
        if done.returncode != 0 or not found:
            raise RuntimeError(f"bare mpiexec training failed ({done.returncode}): {done.stderr[-2000:]}")
        return dict(json.loads(found[-1][len(RESULT) :]))


def measure(epochs: int, runs: int) -> dict[str, Any]:
    """Medians of ``runs`` trainings each way (interleaved), and rank 0's other figures."""
    prepare_data()
    backend = LocalBackend(state_dir=STATE_DIR)
    ours: list[dict[str, Any]] = []
    bare: list[dict[str, Any]] = []
    try:
        with BarePods(backend) as pods:
            for _ in range(runs):  # interleaved: the machine's load drifts into both alike
                bare.append(pods.train(epochs))
                ours.append(through_operator(backend, epochs))
    finally:
        shutil.rmtree(DATA, ignore_errors=True)
    return {
        "operator_steps_per_s": statistics.median(r["steps_per_second"] for r in ours),
        "bare_steps_per_s": statistics.median(r["steps_per_second"] for r in bare),
        "operator_train_s": statistics.median(r["train_seconds"] for r in ours),
        "bare_train_s": statistics.median(r["train_seconds"] for r in bare),
        "operator_runs": [r["steps_per_second"] for r in ours],
        "bare_runs": [r["steps_per_second"] for r in bare],
        "test_accuracy": ours[-1]["test_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(measure(args.epochs, args.runs), indent=1))


if __name__ == "__main__":
    try:
        main()
    finally:
        remove_state_dir()
