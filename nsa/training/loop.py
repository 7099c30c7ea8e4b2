"""The training run: build the model, optimizer, data and heartbeat, resume, then step.

One step: draw this rank's batch ids [b, S + 1] (nsa.data, a pure function of seed, step and
rank), loss = next-token cross entropy (under bf16 autocast when dtype is bfloat16),
backward, clip the global grad norm, AdamW step, cosine-with-warm-up learning rate step.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nsa.config import NSAConfig
from nsa.data import ByteTextData, SyntheticData
from nsa.model import NSATransformer
from nsa.training.checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint,
    resume_path,
    save_checkpoint,
)
from nsa.training.heartbeat import Heartbeat, heartbeat_path
from nsa.training.optim import build_optimizer, build_scheduler
from nsa.training.options import PROG, TrainArgs, check_args
from nsa.training.runtime import (
    Runtime,
    autocast_context,
    seed_everything,
    setup_runtime,
    teardown_runtime,
    wrap_for_training,
)


def build_data(args: TrainArgs, cfg: NSAConfig, runtime: Runtime):
    """This rank's token source: `.batch_at(step)` -> int64 [batch, seq_len + 1]."""
    shard = {"seed": args.seed, "rank": runtime.rank, "world_size": runtime.world_size}
    if args.data == "text":
        return ByteTextData(args.text_path, args.seq_len, args.batch, **shard)
    return SyntheticData(args.seq_len, args.batch, vocab_size=cfg.vocab_size, **shard)


@dataclass
class StepResult:
    step: int
    loss: float
    lr: float
    grad_norm: float
    step_s: float = 0.0


@dataclass
class Session:
    """The live objects of one training run."""

    args: TrainArgs
    runtime: Runtime
    model: NSATransformer  # unwrapped: what is checkpointed and clipped
    trainee: nn.Module  # forward(ids) -> loss; DDP-wrapped when distributed
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data: SyntheticData | ByteTextData
    heartbeat: Heartbeat


def train_step(session: Session, ids: torch.Tensor, step: int) -> StepResult:
    """One optimizer step on this rank's ids [b, S+1]; the loss is the mean over all ranks."""
    model, optimizer, runtime = session.model, session.optimizer, session.runtime
    optimizer.zero_grad(set_to_none=True)
    with autocast_context(model.cfg, runtime.device):
        loss = session.trainee(ids)
    loss.backward()
    max_norm = session.args.grad_clip if session.args.grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    session.scheduler.step()
    loss = loss.detach()
    if runtime.distributed:
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        loss /= runtime.world_size
    return StepResult(step, loss.item(), lr, float(grad_norm))


def train(args: TrainArgs) -> dict[str, Any]:
    """Train as configured by `args`; return a summary.

    Returns {"step": last step reached, "start_step": step resumed from (0 if fresh),
    "losses": mean-over-ranks loss of each step run here, "tokens_per_s": global tokens / s
    of this run, "steps_per_s", "rank", "world_size", "checkpoint": last checkpoint or None}.
    Raises UsageError for bad options (before any work) or an incompatible checkpoint.
    """
    cfg = check_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    runtime = setup_runtime(args.device, args.pg_timeout)
    finished = False
    try:
        summary = _train(args, cfg, runtime)
        finished = True
        return summary
    finally:
        teardown_runtime(runtime, finished)


def _train(args: TrainArgs, cfg: NSAConfig, runtime: Runtime) -> dict[str, Any]:
    seed_everything(args.seed)
    model = NSATransformer(cfg).to(runtime.device)
    optimizer = build_optimizer(model, args)
    scheduler = build_scheduler(optimizer, args)
    source = resume_path(args)
    start = load_checkpoint(source, model, optimizer, scheduler) if source else 0
    session = Session(args, runtime, model, wrap_for_training(model, runtime), optimizer,
                      scheduler, build_data(args, cfg, runtime),
                      Heartbeat(heartbeat_path(args, runtime), runtime))
    session.heartbeat.write("start", step=start, steps=args.steps, device=str(runtime.device),
                            resumed_from=str(source) if source else None,
                            config=dataclasses.asdict(cfg))
    resumed = f", resumed from {source}" if source else ""
    _log(runtime, f"{_count(model):,} parameters, world size {runtime.world_size}, "
                  f"device {runtime.device}, steps {start + 1}..{args.stop_at or args.steps}"
                  f"{resumed}")
    end: dict[str, Any] = {"status": "error", "step": None}
    try:
        summary = _loop(session, start)
        end.update(status="ok", step=summary["step"])
        return summary
    except BaseException as err:
        end["error"] = f"{type(err).__name__}: {err}"[:1000]
        raise
    finally:
        session.heartbeat.write("end", **end)
        session.heartbeat.close()


def _loop(session: Session, start: int) -> dict[str, Any]:
    """Steps start+1 .. stop_at (or steps); checkpoints; the summary of `train`."""
    args, runtime = session.args, session.runtime
    last = args.stop_at or args.steps
    tokens_per_step = args.batch * args.seq_len
    checkpoint = Path(args.out) / CHECKPOINT_NAME if args.out else None
    saved, losses, busy_s, step = None, [], 0.0, start
    for step in range(start + 1, last + 1):
        began = time.perf_counter()
        ids = session.data.batch_at(step - 1).to(runtime.device, non_blocking=True)
        result = train_step(session, ids, step)
        result.step_s = time.perf_counter() - began  # loss.item() synchronised the device
        losses.append(result.loss)
        busy_s += result.step_s
        session.heartbeat.write("step", step=step, loss=result.loss, lr=result.lr,
                                grad_norm=result.grad_norm, step_s=result.step_s,
                                tokens_per_s=tokens_per_step / result.step_s,
                                **session.heartbeat.memory())
        if args.log_every and (step % args.log_every == 0 or step == last):
            _log(runtime, _progress_line(result, args.steps, tokens_per_step * runtime.world_size))
        if checkpoint and _should_save(step, last, args.save_every):
            if runtime.rank == 0:
                save_checkpoint(checkpoint, session.model, session.optimizer, session.scheduler,
                                step, args)
            saved = str(checkpoint)
    if runtime.distributed:
        dist.barrier()  # the last checkpoint is on disk before any rank returns
    ran = len(losses)
    return {"step": step, "start_step": start, "losses": losses,
            "tokens_per_s": ran * tokens_per_step * runtime.world_size / busy_s if ran else 0.0,
            "steps_per_s": ran / busy_s if ran else 0.0, "rank": runtime.rank,
            "world_size": runtime.world_size, "checkpoint": saved}


def _should_save(step: int, last: int, every: int) -> bool:
    """Every `every` steps (0: never periodically) and always at the last step of a run."""
    return step == last or (every > 0 and step % every == 0)


def _progress_line(result: StepResult, steps: int, global_tokens: int) -> str:
    return (f"step {result.step:>{len(str(steps))}}/{steps}  loss {result.loss:.4f}  "
            f"lr {result.lr:.2e}  gnorm {result.grad_norm:.3f}  "
            f"{global_tokens / result.step_s:,.0f} tok/s  {result.step_s * 1e3:.0f} ms/step")


def _log(runtime: Runtime, message: str) -> None:
    if runtime.rank == 0:
        print(f"{PROG}: {message}", flush=True)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
