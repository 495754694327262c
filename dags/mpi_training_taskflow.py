"""Example, TaskFlow style: the same pipeline as ``mpi_training_pipeline`` (preprocess -> MPI
DeepSpeed training, 1 master + 2 workers -> eval), with the training written as a ``@task.mpi``
function instead of a separate script.

    airflow dags test mpi_training_taskflow

The function runs on every rank under mpiexec, from its own source: everything it needs is
imported and defined inside it, and its inputs are its arguments (the XCom of ``preprocess`` and
the DAG's params, resolved before the job starts). Rank 0's return value is the task's XCom.
On Kubernetes, as for the other example: a connection ``mpi_default`` with extra
``{"backend": "kubernetes"}``, ``MPI_DEMO_IMAGE`` (an image with torch, DeepSpeed and Open MPI)
and ``MPI_DEMO_DATA`` (a directory every node and the Airflow workers share).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Param, task

DATA_ROOT = os.environ.get("MPI_DEMO_DATA", "/var/tmp/airflow-mpi-demo")
# On Kubernetes, the data on a PersistentVolumeClaim (ReadWriteMany) that every pod mounts at
# DATA_ROOT, as the Airflow workers do (restricted namespaces refuse hostPath volumes).
DATA_CLAIM = os.environ.get("MPI_DEMO_PVC")
DATA_VOLUME = {"name": "data", "mount_path": DATA_ROOT}
DATA_VOLUME.update({"persistent_volume_claim": DATA_CLAIM} if DATA_CLAIM else {"host_path": DATA_ROOT})
IMAGE = os.environ.get("MPI_DEMO_IMAGE", "airflow-mpi/train:0.1")
DEFERRABLE = os.environ.get("MPI_DEMO_DEFERRABLE") == "1"
MIN_ACCURACY = 0.85

with DAG(
    dag_id="mpi_training_taskflow",
    description="digits with @task.mpi: preprocess -> DeepSpeed ZeRO training over MPI -> eval",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    tags=["mpi", "deepspeed", "example", "taskflow"],
    params={
        "epochs": Param(12, type="integer", minimum=1, description="training epochs"),
        "zero_stage": Param(2, type="integer", minimum=0, maximum=3, description="DeepSpeed ZeRO stage"),
        "workers": Param(2, type="integer", minimum=0, maximum=16, description="worker pods (1 rank each)"),
    },
) as dag:

    @task
    def preprocess(dag_run=None) -> str:  # type: ignore[no-untyped-def]
        """Split scikit-learn's bundled digits into train/test shards in this run's own directory."""
        import numpy as np
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        run_dir = Path(DATA_ROOT) / "runs" / re.sub(r"[^A-Za-z0-9_.-]+", "_", dag_run.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        digits = load_digits()
        x = (digits.data / 16.0).astype("float32")
        x_train, x_test, y_train, y_test = train_test_split(
            x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
        )
        np.savez(run_dir / "train.npz", x=x_train, y=y_train)
        np.savez(run_dir / "test.npz", x=x_test, y=y_test)
        print(f"{len(x_train)} training and {len(x_test)} test samples in {run_dir}")
        return str(run_dir)

    @task.mpi(
        task_id="train",
        name="digits-tf",
        image=IMAGE,
        master={"cpu": 1, "memory": "2Gi"},
        workers={"replicas": "{{ params.workers }}", "cpu": 1, "memory": "2Gi"},
        # One thread per rank: the ranks share this machine's cores.
        env={"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"},
        mpi={"btl": "tcp,self"},
        timeout=900,
        startup_timeout=120,
        pod={"volumes": [DATA_VOLUME]},
        deferrable=DEFERRABLE,
    )
    def train(data_dir: str, epochs: int, zero_stage: int, micro_batch_size: int = 32, lr: float = 1e-3) -> dict:  # type: ignore[type-arg]
        """DeepSpeed ZeRO on every rank (a library, never a launcher: mpiexec started the ranks);
        rank 0 saves model.pt and returns the metrics."""
        import socket
        import time
        from pathlib import Path

        import deepspeed
        import numpy as np
        import torch
        import torch.distributed as dist

        started = time.monotonic()
        epochs, zero_stage = int(epochs), int(zero_stage)  # rendered templates arrive as text
        # On CPU, init_distributed JIT-builds an inference-only all-reduce op (~100 s cold): skip it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=True)
        # ZeRO's collectives go through DeepSpeed's torch backend, which calls
        # all_gather_into_tensor and reduce_scatter_tensor: torch 2.13 deprecates both (a
        # FutureWarning on every rank) for all_gather_single and reduce_scatter_single, the same
        # collectives with the same arguments. Give the backend the current ones.
        from deepspeed.comm import comm

        if hasattr(dist, "all_gather_single"):
            comm.cdb.all_gather_function = dist.all_gather_single
        if hasattr(dist, "reduce_scatter_single"):
            comm.cdb.reduce_scatter_function = dist.reduce_scatter_single
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)

        def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
            with torch.no_grad():
                logits = model(torch.tensor(x, dtype=torch.float32))
                return float((logits.argmax(dim=1) == torch.tensor(y)).float().mean())

        data = Path(data_dir)
        shards = np.load(data / "train.npz")
        x = torch.tensor(shards["x"], dtype=torch.float32)[rank::world]  # this rank's shard
        y = torch.tensor(shards["y"], dtype=torch.long)[rank::world]
        print(f"rank {rank}/{world} on {socket.gethostname()}: {len(x)} training samples")

        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        # A client optimizer: DeepSpeed's own Adam would JIT-compile FusedAdam first.
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        config = {
            "train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": zero_stage},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        }
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        loss_fn = torch.nn.CrossEntropyLoss()
        # Every rank takes the same number of steps, or the collectives would wait forever.
        steps = torch.tensor([len(x) // micro_batch_size])
        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
        generator = torch.Generator().manual_seed(rank)
        for epoch in range(1, epochs + 1):
            order = torch.randperm(len(x), generator=generator)
            total = 0.0
            for step in range(int(steps.item())):
                index = order[step * micro_batch_size : (step + 1) * micro_batch_size]
                loss = loss_fn(engine(x[index]), y[index])
                engine.backward(loss)
                engine.step()
                total += loss.item()
            mean = torch.tensor([total / max(int(steps.item()), 1)])
            dist.all_reduce(mean)
            if rank == 0:
                print(f"epoch {epoch}/{epochs} loss {mean.item() / world:.4f}")

        # Full parameters on every rank (ZeRO-3 partitions them; a no-op for stages 0-2).
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
            state = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
        result = {}
        if rank == 0:
            trained = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
            trained.load_state_dict(state)
            torch.save(state, data / "model.pt")
            test = np.load(data / "test.npz")
            result = {
                "test_accuracy": round(accuracy(trained, test["x"], test["y"]), 4),
                "train_accuracy": round(accuracy(trained, shards["x"], shards["y"]), 4),
                "world_size": world,
                "epochs": epochs,
                "zero_stage": zero_stage,
                "seconds": round(time.monotonic() - started, 2),
                "model": str(data / "model.pt"),
            }
        dist.barrier()
        dist.destroy_process_group()
        return result

    @task
    def evaluate(run_dir: str, metrics: dict) -> float:  # type: ignore[type-arg]
        """Reload the checkpoint, check test accuracy, fail the run below the bar."""
        import logging

        import numpy as np
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        model.load_state_dict(torch.load(Path(run_dir) / "model.pt"))
        test = np.load(Path(run_dir) / "test.npz")
        with torch.no_grad():
            predicted = model(torch.tensor(test["x"])).argmax(dim=1)
        accuracy = float((predicted == torch.tensor(test["y"])).float().mean())
        # Logged, not printed: Airflow stamps a printed line when it reads it, which for a line
        # printed just before returning is after the task's end, so the log page would file it
        # under the collapsed "Post Execute" group. A log record carries its own time.
        logging.getLogger("airflow.task").info(
            "test accuracy %.4f (training reported %s)", accuracy, metrics.get("test_accuracy")
        )
        if accuracy < MIN_ACCURACY:
            raise ValueError(f"test accuracy {accuracy:.4f} is below {MIN_ACCURACY}")
        return accuracy

    run_dir = preprocess()
    metrics = train(run_dir, epochs="{{ params.epochs }}", zero_stage="{{ params.zero_stage }}")
    evaluate(run_dir, metrics)
