"""DDP set-up for torchrun or a multi-task SLURM job: NCCL on GPUs, gloo on CPUs; a no-op for one process."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from training import slurm


@dataclass
class Distributed:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    launcher: str = "single"  # single | torchrun | slurm: who started the ranks and says where they meet

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, value: float, device: torch.device) -> float:
        """The average of a number over ranks."""
        return self.sum([value], device)[0] / self.world_size

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Element-wise sums over ranks (every rank must call it, with the same number of values)."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def min(self, value: int, device: torch.device) -> int:
        """The smallest value of an integer over ranks."""
        if not self.enabled:
            return value
        t = torch.tensor([value], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when it is true on one (e.g. a stop signal)."""
        if not self.enabled:
            return flag
        t = torch.tensor([int(flag)], device=device)
        dist.all_reduce(t)
        return bool(t.item())

    def broadcast(self, obj):
        """Rank 0's value of a picklable object, on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self, finished: bool = True) -> None:
        """Leave the process group in order.

        A rank that finished waits for the others (a barrier), so no rank tears down its connections
        while a peer still uses them. Then a collection frees what still holds the group: the trainer
        that owns DDP sits in reference cycles, so DDP's reducer outlives it until one runs, and a
        gloo group destroyed during interpreter shutdown can abort the process (SIGABRT, "terminate
        called without an active exception"). A rank that failed skips the barrier: its peers may
        never reach it.
        """
        if not (self.enabled and dist.is_initialized()):
            return
        if finished:
            dist.barrier()
        gc.collect()
        dist.destroy_process_group()


def from_environment() -> Distributed:
    """This process's place among the ranks, before any process group exists: torchrun's variables
    (RANK, LOCAL_RANK, WORLD_SIZE), else a multi-task SLURM job's (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        return Distributed(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world_size, "torchrun")
    in_slurm = slurm.slurm_world()
    if in_slurm is not None:
        return Distributed(*in_slurm, launcher="slurm")
    return Distributed()


def relaunch_prefix() -> tuple[str, ...]:
    """How to start this command again, before ``train.py``: ``python``, or torchrun with this run's ranks
    (``--standalone --nproc_per_node=N`` on one machine; on several, the node count and a placeholder for the
    rendezvous the user gave, which the ranks do not see)."""
    state = from_environment()
    if state.launcher != "torchrun":
        return ("python",)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", state.world_size))
    nodes = max(1, state.world_size // per_node)
    if nodes == 1:
        return ("torchrun", "--standalone", f"--nproc_per_node={per_node}")
    return ("torchrun", f"--nnodes={nodes}", f"--nproc_per_node={per_node}", "<your rendezvous options>")


def init_distributed(state: Distributed, device: torch.device) -> None:
    """Join the process group: NCCL on GPUs, gloo on CPUs. SLURM's tasks meet on the job's first node."""
    if not state.enabled:
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if state.launcher == "slurm":
        addr, port = slurm.rendezvous()
        os.environ.setdefault("MASTER_ADDR", addr)
        os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", rank=state.rank,
                            world_size=state.world_size)  # fmt: skip
