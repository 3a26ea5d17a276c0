"""The tensor-parallel process group: collectives for the model, and commands from rank 0 to the workers.

The default group (gloo) carries only the build plan. Then commands (a step's SchedulerOutput, "logits", "stop")
are pickled objects broadcast from rank 0 over a gloo group, and tensors (all-reduce, logits gather, the hidden
rows broadcast) go over a NCCL group on CUDA, the same gloo group on a CPU. Both have the plan's timeout
(parallel.timeout_s): a dead or hung rank makes the others raise instead of blocking them forever.
"""

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class TensorParallelError(RuntimeError):
    """A rank died, hung past the timeout, or failed; the tensor-parallel engine cannot continue."""


@dataclass
class TPGroup:
    rank: int
    world_size: int
    device: torch.device
    control: dist.ProcessGroup | None = None  # the gloo group commands go over
    tensors: dist.ProcessGroup | None = None  # the group tensors go over (NCCL on CUDA, else the control group)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.tensors)
        return t

    def gather_last_dim(self, t: torch.Tensor) -> torch.Tensor | None:
        """Every rank's t, concatenated along the last dim on rank 0 (None on the others)."""
        parts = [torch.empty_like(t) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(t.contiguous(), parts, dst=0, group=self.tensors)
        return None if parts is None else torch.cat(parts, dim=-1)

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=0, group=self.tensors)
        return t

    def send(self, command: tuple) -> None:
        """Rank 0: a command to every worker."""
        dist.broadcast_object_list([command], src=0, group=self.control)

    def receive(self) -> tuple:
        """A worker: the next command from rank 0."""
        box: list[Any] = [None]  # filled with rank 0's pickled command
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather_objects(self, obj) -> list:
        """Every rank's obj, on every rank (the workers' build reports)."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_default(rank: int, world_size: int, init_method: str, timeout_s: float) -> None:
    """Join the default (gloo) group, which carries only the plan: tcp:// from the engine's spawn, env:// under
    torchrun / srun (MASTER_ADDR, MASTER_PORT)."""
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)


def make_group(rank: int, world_size: int, device_type: str, timeout_s: float) -> TPGroup:
    """Every rank calls this with rank 0's device type and timeout (from the plan): a gloo group for commands
    and, on CUDA, a NCCL group for tensors, rank r on local device LOCAL_RANK (or r)."""
    timeout = timedelta(seconds=timeout_s)
    control = dist.new_group(backend="gloo", timeout=timeout)
    if device_type != "cuda":
        return TPGroup(rank, world_size, torch.device("cpu"), control, control)
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    nccl = dist.new_group(backend="nccl", timeout=timeout)
    return TPGroup(rank, world_size, torch.device("cuda", local), control, nccl)


def env_rank() -> tuple[int, int] | None:
    """(rank, world size) when launched by torchrun (RANK, WORLD_SIZE) or Slurm srun (SLURM_PROCID,
    SLURM_NTASKS); None when not launched as one of several."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
    world = os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS"))
    if rank is None or world is None or int(world) < 2:
        return None
    return int(rank), int(world)
