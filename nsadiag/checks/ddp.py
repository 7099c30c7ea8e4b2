"""ddp: N-rank DistributedDataParallel gradients against one process on the same batch.

Runs as a "check" job on N ranks under torchrun (gloo on the CPU, nccl on CUDA), like any
multi-rank job of nsadiag.harness: every rank builds the target with the spec's seed,
wraps its loss in DistributedDataParallel (find_unused_parameters, so a model that skips
parameters is compared, not refused) and back-propagates the next-token loss of its rows
[rank*B, (rank+1)*B) of one global batch [N*B, S+1]; DDP averages the gradients. Rank 0
then builds the same model from the weights DDP started from, back-propagates the whole
global batch in this one process without any process group, and returns the finding:
nsadiag.checks.ckpt's compare_gradients rows (DDP against one process). A rank stuck in a
collective is the watcher's to see (STALL-COLLECTIVE); a rank that raised ends the check
with its exception, e.g. "Expected to mark a variable ready only once" for the late-bound
checkpoint closure with reentrant checkpointing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from nsadiag.checks import TOLERANCE, CheckResult, finding
from nsadiag.checks.compare import model_device, random_ids
from nsadiag.harness.heartbeat import HeartbeatWriter, hook_modules
from nsadiag.spec import TrialSpec
from nsadiag.targets import Target, resolve

if TYPE_CHECKING:
    from nsadiag.harness.rank import RankEnv


class LossOf(nn.Module):
    """forward(ids [B, S+1]) -> the target's scalar loss, so DDP wraps the whole step."""

    def __init__(self, target: Target):
        super().__init__()
        self.model, self._loss = target.model, target.loss

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self._loss(ids)


def measure(spec: TrialSpec, writer: HeartbeatWriter, rank: RankEnv | None) -> CheckResult | None:
    """This rank's part of the check; rank 0 returns the finding, the others None."""
    from nsadiag.checks.ckpt import compare_gradients
    from nsadiag.harness.rank import wrap_ddp

    if rank is None or rank.world_size < 2:
        raise ValueError("world_size: the ddp check needs at least 2 ranks under torchrun")
    torch.manual_seed(spec.seed)
    target = resolve(spec)
    initial = {k: v.detach().clone() for k, v in target.model.state_dict().items()}
    device = model_device(target.model)
    world, r = rank.world_size, rank.rank
    batch = random_ids(target.vocab_size, world * spec.batch, spec.seq_len + 1, spec.seed,
                       device)
    ddp = wrap_ddp(LossOf(target), device, find_unused=True)
    with hook_modules(target, writer):
        writer.start("forward", 0)
        loss = ddp(batch[r * spec.batch:(r + 1) * spec.batch])
        writer.start("backward", 0)
        loss.backward()
    got = {n: None if p.grad is None else p.grad.detach().clone()
           for n, p in target.model.named_parameters()}
    if r != 0:
        return None
    torch.manual_seed(spec.seed)
    single = resolve(spec)
    single.model.load_state_dict(initial)  # DDP broadcast rank 0's initial weights
    with hook_modules(single, writer):
        writer.start("forward", 1)
        loss = single.loss(batch)
        writer.start("backward", 1)
        loss.backward()
    reference = {n: None if p.grad is None else p.grad.detach().clone()
                 for n, p in single.model.named_parameters()}
    return judge({"world_size": world, "rows": compare_gradients(single, got, reference)})


def judge(found: dict) -> CheckResult:
    rows, world = found["rows"], found["world_size"]
    bad = [r for r in rows if not r["ok"]]
    worst = max(rows, key=lambda r: r["max abs err"] / r["tol"]) if rows else None
    if not bad:
        summary = (f"{world}-rank DDP gradients match one process on the same global batch "
                   f"within {TOLERANCE:g} relative over {len(rows)} parameter groups "
                   f"(worst {worst['module']}: {worst['max abs err']:.3g})" if worst else
                   f"{world}-rank DDP: the target has no parameters")
        return finding("ddp", True, None, summary, rows, world_size=world)
    first = bad[0]
    summary = (f"{world}-rank DDP gradients differ from one process at {first['module']} "
               f"({first['detail']}: max abs err {first['max abs err']:.3g} > tol "
               f"{first['tol']:.3g}); {len(bad)} of {len(rows)} parameter groups differ")
    return finding("ddp", False, first["module"], summary, rows, world_size=world)
