"""One rank of a DDP trial: `python -m torch.distributed.run --standalone --nproc-per-node N
-m nsadiag.ddp_trial SPEC_JSON BACKEND PG_TIMEOUT_S`.

Like nsadiag.trial, per rank, in <out_dir>/rank-<r>/: faulthandler armed on SIGUSR1 into
faulthandler.txt, heartbeat events in events.jsonl (with "collective" events, see
nsadiag.collectives), result.json written atomically at the end. In order: join the
process group (BACKEND gloo | nccl, timeout PG_TIMEOUT_S seconds, so a collective that
never completes raises instead of waiting the default 30 minutes); build the target; wrap
it in DistributedDataParallel with a counting allreduce comm hook; count the
torch.distributed collectives the trial and the model issue; run `spec.steps` steps on this
rank's rows [r*b, (r+1)*b) of a global batch [N*b, S + 1] drawn from spec.seed (N ranks of
b rows see what one process of N*b rows would); after every step, all_reduce the loss so
result.json holds the mean over ranks.

result.json: the fields of nsadiag.trial's result plus rank, world_size, pid and
collectives_issued. Exit 0 when every step ran, 1 when an exception was recorded (the
process then ends with os._exit, because a process group whose peer is gone can block the
interpreter's shutdown), 2 for bad arguments.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsadiag.collectives import CollectiveCounter, RankHeartbeat
from nsadiag.processes import die_with_parent
from nsadiag.spec import TrialSpec
from nsadiag.trial import (
    LEARNING_RATE,
    Progress,
    _result,
    arm_faulthandler,
    describe,
    run_step,
    seed_everything,
    write_result,
)

if TYPE_CHECKING:
    from torch import nn

    from nsadiag.targets import Target

BACKENDS = ("gloo", "nccl")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    die_with_parent()
    try:
        spec, backend, pg_timeout_s = _parse(args)
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
    except (ValueError, KeyError) as exc:
        print(f"nsadiag.ddp_trial: {exc}", file=sys.stderr)
        return 2
    rank_dir = Path(spec.out_dir) / f"rank-{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    arm_faulthandler(rank_dir / "faulthandler.txt")
    writer = RankHeartbeat(rank_dir / "events.jsonl", rank)
    writer.start("build")
    progress, counter = Progress(), CollectiveCounter(writer)
    error = None
    try:
        train_rank(spec, backend, pg_timeout_s, rank, world_size, writer, counter, progress)
    except Exception as exc:  # recorded for the parent, like nsadiag.trial
        error = describe(exc)
    status = "ok" if error is None else "error"
    writer.end(status)
    writer.close()
    result = _result(status, progress, error)
    result.update(rank=rank, world_size=world_size, pid=os.getpid(),
                  collectives_issued=counter.count)
    write_result(rank_dir / "result.json", result)
    if error is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    _shutdown()
    return 0


def _parse(args: list[str]) -> tuple[TrialSpec, str, float]:
    if len(args) != 3:
        raise ValueError("usage: python -m nsadiag.ddp_trial SPEC_JSON BACKEND PG_TIMEOUT_S")
    spec = TrialSpec.from_json(args[0])
    if args[1] not in BACKENDS:
        raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {args[1]!r}")
    try:
        timeout = float(args[2])
    except ValueError:
        raise ValueError(f"pg_timeout_s: must be a number of seconds, got {args[2]!r}") from None
    if not timeout > 0:
        raise ValueError(f"pg_timeout_s: must be > 0, got {args[2]!r}")
    return spec, args[1], timeout


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def loss_module(target: Target) -> nn.Module:
    """The module DDP wraps: its forward(ids [B, S + 1]) is the target's loss, so the whole
    loss runs inside DDP's forward (DDP reduces only the work done inside it)."""
    from torch import nn

    class TargetLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = target.model

        def forward(self, ids):
            return target.loss(ids)

    return TargetLoss()


def find_unused(spec: TrialSpec) -> bool:
    """DDP must look for unused parameters where the model leaves some without a gradient:
    the NSA selection branch alone scores blocks with the compression keys but never
    back-propagates into them (as in nsa.train.wrap_for_training)."""
    branches = spec.branches or ()
    return spec.target == "nsa" and "sel" in branches and "cmp" not in branches


def train_rank(spec: TrialSpec, backend: str, pg_timeout_s: float, rank: int,
               world_size: int, writer: RankHeartbeat, counter: CollectiveCounter,
               progress: Progress) -> None:
    """Join the group, build, wrap in DDP, and train `spec.steps` steps on this rank's rows."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from nsadiag.heartbeat import watch
    from nsadiag.targets import resolve

    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=pg_timeout_s))
    if backend == "nccl":
        from nsadiag.probes.flight_recorder import DumpOnRequest

        trial_dir = Path(spec.out_dir)
        DumpOnRequest(trial_dir / f"rank-{rank}", trial_dir, rank).start()
    seed_everything(spec.seed)
    target = resolve(spec)
    device = next(target.model.parameters()).device
    ddp = DistributedDataParallel(
        loss_module(target), device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=find_unused(spec))
    ddp.register_comm_hook(None, counter.ddp_hook)
    counter.install()
    optimizer = torch.optim.AdamW(target.model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(spec.seed)
    trainee = dataclasses.replace(target, loss=ddp)
    rows = slice(rank * spec.batch, (rank + 1) * spec.batch)
    try:
        with watch(target, writer):
            for step in range(spec.steps):
                batch = torch.randint(target.vocab_size, (world_size * spec.batch,
                                                          spec.seq_len + 1),
                                      generator=generator)
                before = writer.module_events
                run_step(spec, trainee, optimizer, batch[rows].to(device), step, writer,
                         progress)
                if step == 0:
                    progress.expected_events_per_step = writer.module_events - before
                progress.loss[-1] = _mean_over_ranks(progress.loss[-1], device, world_size)
    finally:
        counter.remove()


def _mean_over_ranks(value: float, device: Any, world_size: int) -> float:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item()) / world_size


if __name__ == "__main__":
    sys.exit(main())
