"""What a child needs to be one rank of a torchrun job: its rank, the process group, DDP.

One process-group timeout for every multi-rank job (nsadiag.harness.times.pg_timeout_for):
long enough that the parent sees a stalled collective and samples every rank's stacks
before the collective raises, short enough that a collective that never completes ends in
minutes, not torch's default 30. Every rank dies with its parent (PR_SET_PDEATHSIG): torchrun puts
each rank in a session of its own, out of reach of a process-group kill.
"""

from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

DDP_BACKENDS = ("gloo", "nccl")
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankEnv:
    """This process's place in a torchrun job, from torchrun's environment variables."""

    rank: int
    world_size: int
    local_rank: int


def rank_env(environ: dict[str, str] | None = None) -> RankEnv | None:
    """RANK / WORLD_SIZE / LOCAL_RANK, or None outside a multi-process job."""
    env = os.environ if environ is None else environ
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return RankEnv(rank, world, int(env.get("LOCAL_RANK", rank)))


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def init_process_group(backend: str, timeout_s: float, local_rank: int) -> None:
    """Join the job's default process group (gloo on CPU, nccl with one GPU per rank)."""
    import torch
    import torch.distributed as dist

    if backend not in DDP_BACKENDS:
        raise ValueError(f"ddp_backend: must be one of {', '.join(DDP_BACKENDS)}, "
                         f"got {backend!r}")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def shutdown(finished: bool) -> None:
    """Leave the process group; a rank that finished waits for its peers first
    (`nsa.ddp.leave_process_group` says why)."""
    from nsa.ddp import leave_process_group

    leave_process_group(finished)


def wrap_ddp(module: nn.Module, device: torch.device, find_unused: bool) -> nn.Module:
    """DistributedDataParallel around `module` (its forward must be the whole loss)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(module, find_unused_parameters=find_unused,
                                   device_ids=[device.index] if device.type == "cuda" else None)


def mean_over_ranks(value: float, device: Any, world_size: int) -> float:
    """The mean of a float over every rank (an all_reduce)."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item()) / world_size
