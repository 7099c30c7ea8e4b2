"""Where a training process runs: single process or a torchrun rank, its device, the
DDP-wrapped loss module and bf16 autocast."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nsa.config import NSAConfig
from nsa.ddp import leave_process_group
from nsa.model import NSATransformer


@dataclass(frozen=True)
class Runtime:
    """Where this process runs: its rank among world_size, and its device."""

    rank: int
    world_size: int
    device: torch.device
    distributed: bool


def setup_runtime(device: str, pg_timeout: float) -> Runtime:
    """Single process, or join the torchrun process group (gloo on CPU, nccl on CUDA)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not dist.is_torchelastic_launched():
        return Runtime(0, 1, torch.device(device), distributed=False)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=pg_timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        local = dist.get_node_local_rank(fallback_rank=rank % torch.cuda.device_count())
        torch.cuda.set_device(local)
        return Runtime(rank, world_size, torch.device("cuda", local), distributed=True)
    return Runtime(rank, world_size, torch.device("cpu"), distributed=True)


def teardown_runtime(runtime: Runtime, finished: bool = False) -> None:
    """Leave the process group (`nsa.ddp.leave_process_group`)."""
    if runtime.distributed:
        leave_process_group(finished)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class LossModule(nn.Module):
    """forward(ids [B, S+1]) -> scalar next-token loss, so that DDP wraps the whole step.

    DDP only reduces gradients of work done inside its own forward; calling
    `model.loss` on the unwrapped model would bypass it.
    """

    def __init__(self, model: NSATransformer):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.loss(ids)


def wrap_for_training(model: NSATransformer, runtime: Runtime) -> nn.Module:
    """The module whose forward is the loss: DDP-wrapped when distributed."""
    module = LossModule(model)
    if not runtime.distributed:
        return module
    cfg = model.cfg
    # Selection alone scores blocks with compress_k but never back-propagates through it.
    unused = "sel" in cfg.branches and "cmp" not in cfg.branches
    device_ids = [runtime.device.index] if runtime.device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids,
                                   find_unused_parameters=unused)


def autocast_context(cfg: NSAConfig, device: torch.device):
    """bf16 autocast (CPU or CUDA) when cfg.dtype is bfloat16; parameters stay fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16")
