"""torchrun worker of the ddp check, one per rank:

    python -m torch.distributed.run --standalone --nproc_per_node N \\
        -m nsadiag.checks.ddp_worker SPEC_JSON OUT_DIR PG_TIMEOUT_S

Every rank builds the target with the spec's seed, wraps it in DistributedDataParallel
(find_unused_parameters, so a model that skips parameters is compared, not refused) and
back-propagates the next-token loss of its rows [rank*B, (rank+1)*B) of one global batch
[N*B, S+1]; DDP averages the gradients. Rank 0 then builds the same model from the weights
DDP started from, back-propagates the whole global batch in this one process without any
process group, and writes OUT_DIR/ddp.json: the gradient rows of nsadiag.checks.ckpt's
compare_gradients (DDP against one process). Each rank writes heartbeat events to
OUT_DIR/rank<r>.jsonl and, on an exception, OUT_DIR/rank<r>.error.json, then exits 1.

The process group times out after PG_TIMEOUT_S, so a rank stuck in a collective fails
instead of waiting; each rank dies with torchrun (PR_SET_PDEATHSIG), because torchrun
starts its workers in sessions of their own, out of reach of a process-group kill.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nsadiag.checks.ckpt import compare_gradients
from nsadiag.checks.compare import model_device, random_ids
from nsadiag.heartbeat import HeartbeatWriter, watch
from nsadiag.processes import die_with_parent
from nsadiag.spec import TrialSpec
from nsadiag.targets import Target, resolve
from nsadiag.trial import describe


class LossOf(nn.Module):
    """forward(ids [B, S+1]) -> the target's scalar loss, so DDP wraps the whole step."""

    def __init__(self, target: Target):
        super().__init__()
        self.model, self._loss = target.model, target.loss

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self._loss(ids)


def main(spec_path: str, out_dir: str, pg_timeout_s: float) -> int:
    die_with_parent()
    out = Path(out_dir)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    writer = HeartbeatWriter(out / f"rank{rank}.jsonl")
    writer.start("build")
    try:
        spec = TrialSpec.from_json(spec_path)
        cuda = spec.device == "cuda" or (spec.device == "auto" and torch.cuda.is_available())
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl" if cuda else "gloo",
                                timeout=timedelta(seconds=pg_timeout_s))
        rows = compare(spec, rank, world, writer)
        if rank == 0:
            (out / "ddp.json").write_text(json.dumps({"world_size": world, "rows": rows}))
        dist.destroy_process_group()
    except Exception as exc:  # the check reads the cause from here, not from torchrun's log
        (out / f"rank{rank}.error.json").write_text(json.dumps(describe(exc)))
        writer.end("error")
        return 1
    writer.end("ok")
    return 0


def compare(spec: TrialSpec, rank: int, world: int, writer: HeartbeatWriter) -> list[dict]:
    """DDP gradients of this rank's shard; on rank 0 also the one-process reference."""
    torch.manual_seed(spec.seed)
    target = resolve(spec)
    initial = {k: v.detach().clone() for k, v in target.model.state_dict().items()}
    device = model_device(target.model)
    batch = random_ids(target.vocab_size, world * spec.batch, spec.seq_len + 1, spec.seed,
                       device)
    ddp = DistributedDataParallel(LossOf(target), find_unused_parameters=True,
                                  device_ids=[device.index] if device.type == "cuda" else None)
    with watch(target, writer):
        writer.start("forward", 0)
        loss = ddp(batch[rank * spec.batch:(rank + 1) * spec.batch])
        writer.start("backward", 0)
        loss.backward()
    got = {n: None if p.grad is None else p.grad.detach().clone()
           for n, p in target.model.named_parameters()}
    if rank != 0:
        return []
    torch.manual_seed(spec.seed)
    single = resolve(spec)
    single.model.load_state_dict(initial)  # DDP broadcast rank 0's initial weights
    with watch(single, writer):
        writer.start("forward", 1)
        loss = single.loss(batch)
        writer.start("backward", 1)
        loss.backward()
    reference = {n: None if p.grad is None else p.grad.detach().clone()
                 for n, p in single.model.named_parameters()}
    return compare_gradients(single, got, reference)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
