"""Train an MLP on scikit-learn's digits with DeepSpeed ZeRO, one process per MPI rank, on CPU.

Started by mpiexec through airflow-mpi's rank wrapper, which sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT: ``deepspeed.init_distributed`` then needs no MPI discovery, and
plain torch.distributed code would work the same. DeepSpeed is a library here, never a launcher
(``mpiexec ... deepspeed train.py`` would start a second launcher whose ranks clash with mpiexec's).

Every epoch ends with a DeepSpeed checkpoint in ``<data>/checkpoints`` (every rank saves its
part, then rank 0 writes a completion marker), and a start loads the newest complete one and goes
on from the next epoch: a retry of the task after a lost worker resumes instead of starting over,
and a checkpoint torn by a save cut short is passed over for the one before, saying so. The data
directory is the run's own, so a retry finds its own run's checkpoints and never another run's.
Each epoch's sample order depends only on ``--seed``, the rank and the epoch, so a resumed run
trains on what an unbroken one would have.

SIGTERM is the notice that the pods are about to go (the task was killed, the job preempted):
the ranks agree on a step boundary (every ``--notice-every`` steps they ask one another), save
there (``epoch<E>-step<S>``: E whole epochs and S steps of the next) and exit 143, so the next
start goes on from that very step and no step is lost.

Rank 0 writes the trained weights to the data directory, as ``model.pt`` (torch's format) and
``model.npz`` (plain arrays, which a task reads with numpy alone: an Airflow worker's image need not
carry torch), and prints its metrics on a line starting with ``AIRFLOW_MPI_RESULT`` (the operator
returns them through XCom).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

# The file naming the newest complete checkpoint (DeepSpeed's own name: load_checkpoint reads it).
LATEST = "latest"
# Written last into each epoch's directory, atomically, by rank 0 once every rank has saved: the
# world size that wrote it (a resume needs as many ranks) and each file's size. An epoch without
# it, or whose files differ from it, is torn and is never resumed from.
COMPLETE = "COMPLETE.json"
# The exit code of a rank that saved on the notice: 128 + SIGTERM, as if the signal had ended it.
SAVED_ON_NOTICE = 143


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="directory with train.npz and test.npz")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--zero-stage", type=int, default=2, choices=[0, 1, 2, 3])
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoints", help="checkpoint directory, shared by every rank (default: DATA/checkpoints)")
    parser.add_argument("--keep-checkpoints", type=int, default=2, help="how many of the newest checkpoints to keep")
    parser.add_argument("--notice-every", type=int, default=10, help="steps between the ranks' checks for SIGTERM")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import numpy as np
    import torch
    import torch.distributed as dist

    # On CPU, init_distributed JIT-builds an inference-only all-reduce op (~100 s cold): skip it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=True)
    use_current_collectives(dist)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    data = Path(args.data)
    train = np.load(data / "train.npz")
    x_all = torch.tensor(train["x"], dtype=torch.float32)
    y_all = torch.tensor(train["y"], dtype=torch.long)
    x, y = x_all[rank::world], y_all[rank::world]  # this rank's shard
    print(f"rank {rank}/{world} on {socket.gethostname()}: {len(x)} training samples", flush=True)

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    # A client optimizer: DeepSpeed's own Adam would JIT-compile FusedAdam first (~170 s cold).
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.zero_stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": args.dtype == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    loss_fn = torch.nn.CrossEntropyLoss()
    # Every rank takes the same number of steps, or the collectives would wait forever.
    steps = min_over_ranks(len(x) // args.micro_batch_size, dist)
    checkpoints = Path(args.checkpoints) if args.checkpoints else data / "checkpoints"
    resumed, skipped, carried = resume(engine, checkpoints, args.epochs, dist)
    checkpoint_seconds = 0.0
    notice = Notice()

    train_started = time.monotonic()  # the loop without its checkpoints: steps_per_second compares launchers
    for epoch in range(resumed + 1, args.epochs + 1):
        # The order depends on (seed, rank, epoch) only: a resumed run sees what an unbroken one would.
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + epoch * 1009 + rank)
        order = torch.randperm(len(x), generator=generator)
        first = skipped if epoch == resumed + 1 else 0
        total = carried if epoch == resumed + 1 and rank == 0 else 0.0  # the epoch's loss so far, all ranks
        for step in range(first, steps):
            if step > first and step % args.notice_every == 0 and notice.agreed(dist):
                sum_of_losses = torch.tensor([total])
                dist.all_reduce(sum_of_losses)
                save(engine, checkpoints, (epoch - 1, step), args.keep_checkpoints, rank, world,
                     loss_total=sum_of_losses.item())  # fmt: skip
                if rank == 0:
                    print(f"SIGTERM: saved checkpoint epoch {epoch - 1} step {step} in {checkpoints}; exiting",
                          flush=True)  # fmt: skip
                dist.barrier()  # every rank past the save and the marker before any exits
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(SAVED_ON_NOTICE)  # now: the interpreter's and torch's teardown take seconds
            index = order[step * args.micro_batch_size : (step + 1) * args.micro_batch_size]
            loss = loss_fn(engine(x[index].to(dtype)).float(), y[index])
            engine.backward(loss)
            engine.step()
            total += loss.item()
        mean = torch.tensor([total / max(steps, 1)])
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs} loss {mean.item() / world:.4f}", flush=True)
        saving = time.monotonic()
        save(engine, checkpoints, (epoch, 0), args.keep_checkpoints, rank, world)
        checkpoint_seconds += time.monotonic() - saving
    train_seconds = time.monotonic() - train_started - checkpoint_seconds
    trained_steps = steps * (args.epochs - resumed) - skipped

    # Full parameters on every rank (ZeRO-3 partitions them; a no-op for stages 0-2).
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        state = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
    if rank == 0:
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        model.load_state_dict(state)
        torch.save(state, data / "model.pt")
        np.savez(data / "model.npz", **{name: value.numpy() for name, value in state.items()})
        test = np.load(data / "test.npz")
        accuracy = evaluate(model, test["x"], test["y"])
        train_accuracy = evaluate(model, train["x"], train["y"])
        result = {
            "test_accuracy": round(accuracy, 4),
            "train_accuracy": round(train_accuracy, 4),
            "world_size": world,
            "epochs": args.epochs,
            "zero_stage": args.zero_stage,
            "seconds": round(time.monotonic() - started, 2),
            "resumed_from_epoch": resumed,
            "resumed_from_step": skipped,
            "trained_steps": trained_steps,
            "checkpoint_seconds": round(checkpoint_seconds, 3),
            "train_seconds": round(train_seconds, 3),
            "steps_per_second": round(trained_steps / train_seconds, 2) if trained_steps else None,
            "model": str(data / "model.pt"),
            "weights": str(data / "model.npz"),
        }
        print("AIRFLOW_MPI_RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def use_current_collectives(dist: object) -> None:
    """ZeRO gathers and scatters its partitions through DeepSpeed's torch backend, which calls
    ``torch.distributed.all_gather_into_tensor`` and ``reduce_scatter_tensor``: torch 2.13
    deprecates both (a FutureWarning on every rank) for ``all_gather_single`` and
    ``reduce_scatter_single``, the same collectives with the same arguments. Give the backend
    the current ones; with an older torch that lacks them it keeps its own choice."""
    from deepspeed.comm import comm

    backend = comm.cdb
    if hasattr(dist, "all_gather_single"):
        backend.all_gather_function = dist.all_gather_single
    if hasattr(dist, "reduce_scatter_single"):
        backend.reduce_scatter_function = dist.reduce_scatter_single


class Notice:
    """SIGTERM sets a flag; ``agreed`` asks every rank (one collective), so that all save at the
    same step: DeepSpeed's save needs every rank, and a rank that went on alone would wait in the
    next step's all-reduce forever."""

    def __init__(self) -> None:
        self.given = False
        signal.signal(signal.SIGTERM, self._note)

    def _note(self, _signum: int, _frame: object) -> None:
        self.given = True

    def agreed(self, dist: object) -> bool:
        import torch

        flag = torch.tensor([1 if self.given else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # type: ignore[attr-defined]
        return bool(flag.item())


def resume(engine: object, directory: Path, epochs: int, dist: object) -> tuple[int, int, float]:
    """Load the newest complete checkpoint (weights, optimizer state, step count) on every rank;
    where it was taken (whole epochs done, steps of the next one done, the sum of that epoch's
    losses so far over all ranks), or (0, 0, 0.0) when there is none. Rank 0 reads which one and
    tells the others, so all ranks load the same. ZeRO splits the optimizer state per rank: a
    checkpoint of another world size is refused, naming it, rather than loaded wrong."""
    import torch

    rank, world = dist.get_rank(), dist.get_world_size()  # type: ignore[attr-defined]
    newest, passed = newest_complete(directory) if rank == 0 else ((0, 0, 0), [])
    choice = torch.tensor(newest)
    dist.broadcast(choice, src=0)  # type: ignore[attr-defined]
    done, step, saved_world = (int(v) for v in choice.tolist())
    if (done or step) and saved_world != world:
        raise RuntimeError(
            f"the newest checkpoint in {directory} was written by {saved_world} ranks, this run has {world}: "
            f"run with {saved_world} ranks to resume it, or delete {directory} to start over"
        )
    if not (done or step):
        return 0, 0, 0.0
    tag = position_tag((done, step))
    path, _ = engine.load_checkpoint(str(directory), tag=tag)  # type: ignore[attr-defined]
    if path is None:
        raise RuntimeError(f"checkpoint {directory / tag} could not be loaded; delete it to start over")
    carried = 0.0
    if rank == 0:
        carried = float(json.loads((directory / tag / COMPLETE).read_text()).get("loss_total", 0.0))
        why = f": the newest complete one ({'; '.join(passed)})" if passed else ""
        at = f"epoch {done} step {step}" if step else f"epoch {done}"
        print(f"resumed from checkpoint {at} (of {epochs}) in {directory}{why}", flush=True)
    return done, step, carried


def save(
    engine: object,
    directory: Path,
    position: tuple[int, int],
    keep: int,
    rank: int,
    world: int,
    loss_total: float = 0.0,
) -> None:
    """Every rank saves its part (DeepSpeed's rule: each holds its own optimizer shard). Only once
    all have (save_checkpoint ends in a barrier) does rank 0 write the checkpoint's completion
    marker and name it in ``latest``, each by an atomic rename: a rank killed mid-save leaves a
    checkpoint without a marker, and the previous one the newest complete one. ``position``:
    whole epochs done and steps of the next one (0 at an epoch's end)."""
    tag = position_tag(position)
    folder = directory / tag
    if rank == 0:  # a marker left by an earlier try that saved this position too no longer holds
        (folder / COMPLETE).unlink(missing_ok=True)
    engine.save_checkpoint(str(directory), tag=tag, save_latest=False)  # type: ignore[attr-defined]
    if rank != 0:
        return
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    marker = {"epoch": position[0], "step": position[1], "world_size": world, "files": files, "loss_total": loss_total}
    write_atomically(folder / COMPLETE, json.dumps(marker))
    write_atomically(directory / LATEST, tag)
    for old in sorted(directory.glob("epoch*"), key=tag_position)[: -max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)


def write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text)
    staging.replace(path)


def position_tag(position: tuple[int, int]) -> str:
    """``epoch3`` after 3 whole epochs; ``epoch3-step40`` 40 steps into the 4th."""
    epoch, step = position
    return f"epoch{epoch}-step{step}" if step else f"epoch{epoch}"


def tag_position(path: Path) -> tuple[int, int]:
    """(whole epochs, steps of the next) a checkpoint directory's name says; (-1, 0) for another name."""
    epoch, _, step = path.name.removeprefix("epoch").partition("-step")
    if not epoch.isdigit() or (step and not step.isdigit()):
        return (-1, 0)
    return (int(epoch), int(step or 0))


def newest_complete(directory: Path) -> tuple[tuple[int, int, int], list[str]]:
    """(whole epochs, steps of the next, world size) of the newest complete checkpoint, (0, 0, 0)
    when there is none; and why each newer one was passed over."""
    passed = []
    for folder in sorted(directory.glob("epoch*"), key=tag_position, reverse=True):
        epoch, step = tag_position(folder)
        if epoch < 0 or (epoch, step) == (0, 0):
            continue
        problem, world = torn(folder)
        if problem is None:
            return (epoch, step, world), passed
        at = f"epoch {epoch} step {step}" if step else f"epoch {epoch}"
        passed.append(f"{at} is torn: {problem}")
    return (0, 0, 0), passed


def torn(folder: Path) -> tuple[str | None, int]:
    """Why this epoch's checkpoint cannot be resumed from (None: it is complete), and its world size."""
    try:
        marker = json.loads((folder / COMPLETE).read_text())
        world, files = int(marker["world_size"]), dict(marker["files"])
    except FileNotFoundError:
        return "no completion marker (its save did not finish)", 0
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"its completion marker is unreadable ({error})", 0
    for name, size in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing", world
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} bytes, {size} when it was saved", world
    return None, world


def min_over_ranks(value: int, dist: object) -> int:
    import torch

    tensor = torch.tensor([value])
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)  # type: ignore[attr-defined]
    return int(tensor.item())


def evaluate(model: object, x: object, y: object) -> float:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor(x, dtype=torch.float32))  # type: ignore[operator]
        return float((logits.argmax(dim=1) == torch.tensor(y)).float().mean())


if __name__ == "__main__":
    main()
