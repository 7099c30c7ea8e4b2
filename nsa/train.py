"""Training entry point: `python -m nsa.train ...`, or `train(TrainArgs(...))` from Python.

One step: draw this rank's batch ids [b, S + 1] (nsa.data, a pure function of seed, step and
rank), loss = next-token cross entropy (under bf16 autocast when dtype is bfloat16),
backward, clip the global grad norm, AdamW step, cosine-with-warm-up learning rate step.

Under torchrun (`torch.distributed.is_torchelastic_launched()`) the model is wrapped in
DistributedDataParallel (gloo on CPU, nccl on CUDA); `--batch` is per rank, and rank r draws
rows [r*b, (r+1)*b) of the global batch, so W ranks of b rows train exactly like one process
of W*b rows.

Every rank appends JSON lines to its heartbeat file, flushed per line: "start", then per step
{"t", "event": "step", "step", "loss" (mean over ranks), "lr", "grad_norm", "tokens_per_s"
(this rank's), "step_s", "rss_bytes", ["cuda_allocated", "cuda_reserved"], "rank",
"world_size"}, then "end" with "status" ok or error. Rank 0 writes checkpoints atomically to
OUT/checkpoint.pt; resuming from step k reproduces the uninterrupted run's losses from step
k + 1 on, bit for bit on CPU. `--stop-at N` ends an invocation early (preemptible queues)
without changing the --steps schedule.

Every bad option ends the CLI with one line `nsa.train: error: ...` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nsa.config import BACKENDS, NSAConfig
from nsa.data import ByteTextData, SyntheticData, default_text_path
from nsa.ddp import leave_process_group
from nsa.model import NSATransformer

PROG = "nsa.train"
CHECKPOINT_NAME = "checkpoint.pt"
TRAIN_DTYPES = ("float32", "bfloat16")
# Fields that may differ between a checkpoint and the run resuming it: they change how the
# model is computed, not what its parameters mean.
RUNTIME_FIELDS = frozenset({"backend", "query_chunk", "grad_ckpt", "dtype"})


class UsageError(Exception):
    """A bad option or input file: reported as one `nsa.train: error:` line, exit code 2."""


@dataclass
class TrainArgs:
    """Everything `train` needs; the CLI flags map 1:1 onto these fields (- becomes _).

    Model fields left at None take the NSAConfig default; `overrides` (--set key=value) sets
    any NSAConfig field and is applied last.
    """

    layers: int | None = None
    dim: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    seq_len: int = 512
    batch: int = 8
    steps: int = 1000
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    data: str = "synthetic"
    text_path: str | None = None
    grad_ckpt: bool = False
    dtype: str = "float32"
    device: str = "auto"
    backend: str = "auto"
    seed: int = 0
    out: str | None = None
    save_every: int = 0
    stop_at: int | None = None
    resume: str | None = None
    heartbeat: str | None = None
    pg_timeout: float = 120.0
    log_every: int = 10
    threads: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Runtime:
    """Where this process runs: its rank among world_size, and its device."""

    rank: int
    world_size: int
    device: torch.device
    distributed: bool


# ----------------------------------------------------------------------------- options


def check_args(args: TrainArgs) -> NSAConfig:
    """Validate every option before any work starts; return the model config.

    Raises UsageError with a one-line message naming the offending option or field.
    """
    _check_numbers(args)
    cfg = build_config(args)
    if cfg.dtype not in TRAIN_DTYPES:
        raise UsageError(f"dtype: training supports {' and '.join(TRAIN_DTYPES)}, "
                         f"got {cfg.dtype!r}")
    if args.data not in ("synthetic", "text"):
        raise UsageError(f"--data: must be synthetic or text, got {args.data!r}")
    if args.data == "text":
        _check_text(args, cfg)
    if args.device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"--device: must be auto, cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: CUDA is not available on this machine")
    _check_paths(args)
    return cfg


def _check_numbers(args: TrainArgs) -> None:
    positive = {"--steps": args.steps, "--batch": args.batch, "--seq-len": args.seq_len,
                "--lr": args.lr, "--pg-timeout": args.pg_timeout}
    for flag, value in positive.items():
        if not value > 0:
            raise UsageError(f"{flag}: must be positive, got {value}")
    non_negative = {"--min-lr": args.min_lr, "--warmup": args.warmup,
                    "--weight-decay": args.weight_decay, "--grad-clip": args.grad_clip,
                    "--save-every": args.save_every, "--log-every": args.log_every,
                    "--threads": args.threads}
    for flag, value in non_negative.items():
        if not value >= 0:
            raise UsageError(f"{flag}: must be >= 0, got {value}")
    if args.min_lr > args.lr:
        raise UsageError(f"--min-lr: must be <= --lr={args.lr}, got {args.min_lr}")
    if args.stop_at is not None and not 1 <= args.stop_at <= args.steps:
        raise UsageError(f"--stop-at: must be in [1, --steps={args.steps}], got {args.stop_at}")


def build_config(args: TrainArgs) -> NSAConfig:
    """NSAConfig from the model flags, then --set overrides; ValueError -> UsageError."""
    flags = {"n_layers": args.layers, "dim": args.dim, "n_heads": args.heads,
             "n_kv_heads": args.kv_heads, "head_dim": args.head_dim}
    changes: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
    changes.update(grad_ckpt=args.grad_ckpt, dtype=args.dtype, backend=args.backend)
    changes.update(args.overrides)
    try:
        return NSAConfig().replace(**changes)
    except (ValueError, TypeError) as err:
        raise UsageError(str(err)) from None


def _check_text(args: TrainArgs, cfg: NSAConfig) -> None:
    path = Path(args.text_path) if args.text_path else default_text_path()
    if not path.is_file():
        raise UsageError(f"--text-path: no such file: {path}")
    if path.stat().st_size < args.seq_len + 1:
        raise UsageError(f"--text-path: {path} is shorter than --seq-len + 1 = "
                         f"{args.seq_len + 1} bytes")
    if cfg.vocab_size < 256:
        raise UsageError(f"vocab_size: byte text needs vocab_size >= 256, got {cfg.vocab_size}")


def _check_paths(args: TrainArgs) -> None:
    if args.save_every and not args.out:
        raise UsageError("--save-every: needs --out DIR")
    if args.resume == "auto" and not args.out:
        raise UsageError("--resume auto: needs --out DIR")
    if args.resume not in (None, "auto") and not Path(args.resume).is_file():
        raise UsageError(f"--resume: no such checkpoint: {args.resume}")


def parse_set_value(text: str) -> Any:
    """'true'/'false' -> bool, 'a,b' -> tuple, then int, float, else the string itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "," in text:
        return tuple(parse_set_value(part) for part in text.split(",") if part)
    for cast in (int, float):
        with contextlib.suppress(ValueError):
            return cast(text)
    return text


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """['key=value', ...] -> {key: parsed value}; later items win."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set: expected key=value, got {item!r}")
        overrides[key.strip()] = parse_set_value(value.strip())
    return overrides


# ----------------------------------------------------------------------------- setup


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


def build_optimizer(model: nn.Module, args: TrainArgs) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (>= 2-D) only, none on gains and biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for 0-based optimizer step `step` of `total`.

    Linear warm-up over `warmup` steps to 1, then cosine down to `min_ratio` at the last step.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, args: TrainArgs):
    factor = functools.partial(lr_factor, warmup=args.warmup, total=args.steps,
                               min_ratio=args.min_lr / args.lr)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_data(args: TrainArgs, cfg: NSAConfig, runtime: Runtime):
    """This rank's token source: `.batch_at(step)` -> int64 [batch, seq_len + 1]."""
    shard = {"seed": args.seed, "rank": runtime.rank, "world_size": runtime.world_size}
    if args.data == "text":
        return ByteTextData(args.text_path, args.seq_len, args.batch, **shard)
    return SyntheticData(args.seq_len, args.batch, vocab_size=cfg.vocab_size, **shard)


def autocast_context(cfg: NSAConfig, device: torch.device):
    """bf16 autocast (CPU or CUDA) when cfg.dtype is bfloat16; parameters stay fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16")


# ----------------------------------------------------------------------------- checkpoints


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, model: NSATransformer, optimizer, scheduler, step: int,
                    args: TrainArgs) -> None:
    """Write the full training state to `path` atomically (tmp file, fsync, os.replace)."""
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "config": dataclasses.asdict(model.cfg),
        "args": dataclasses.asdict(args),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, model: NSATransformer, optimizer, scheduler) -> int:
    """Restore the state saved by save_checkpoint; return its step.

    Raises UsageError when the checkpoint's model differs from this run's in any field
    outside RUNTIME_FIELDS.
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    _check_same_model(state["config"], model.cfg)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return int(state["step"])


def _check_same_model(saved: dict[str, Any], cfg: NSAConfig) -> None:
    current = dataclasses.asdict(cfg)
    for name, value in current.items():
        old = saved.get(name)
        if isinstance(old, list):
            old = tuple(old)
        if name not in RUNTIME_FIELDS and old != value:
            raise UsageError(f"--resume: checkpoint has {name}={old!r}, this run {value!r}")


def resume_path(args: TrainArgs) -> Path | None:
    """The checkpoint to resume from: --resume PATH, or OUT/checkpoint.pt if it exists."""
    if args.resume is None:
        return None
    if args.resume == "auto":
        path = Path(args.out) / CHECKPOINT_NAME
        return path if path.is_file() else None
    return Path(args.resume)


# ----------------------------------------------------------------------------- heartbeat


def heartbeat_path(args: TrainArgs, runtime: Runtime) -> Path | None:
    """--heartbeat PATH ('{rank}' is filled in; several ranks get -rank{r} appended), else
    OUT/heartbeat-rank{r}.jsonl, else None (no heartbeat)."""
    rank = runtime.rank
    if args.heartbeat:
        if "{rank}" in args.heartbeat:
            return Path(args.heartbeat.replace("{rank}", str(rank)))
        path = Path(args.heartbeat)
        if runtime.world_size > 1:
            path = path.with_name(f"{path.stem}-rank{rank}{path.suffix}")
        return path
    if args.out:
        return Path(args.out) / f"heartbeat-rank{rank}.jsonl"
    return None


class Heartbeat:
    """Appends one flushed JSON object per event: {"t", "event", "rank", "world_size", ...}."""

    def __init__(self, path: Path | None, runtime: Runtime):
        self.runtime = runtime
        self.process = psutil.Process()
        self.file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "a", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> None:
        if self.file is None:
            return
        record = {"t": time.time(), "event": event, "rank": self.runtime.rank,
                  "world_size": self.runtime.world_size, **fields}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def memory(self) -> dict[str, int]:
        """rss_bytes, plus cuda_allocated / cuda_reserved on a CUDA device."""
        stats = {"rss_bytes": self.process.memory_info().rss}
        if self.runtime.device.type == "cuda":
            stats["cuda_allocated"] = torch.cuda.memory_allocated(self.runtime.device)
            stats["cuda_reserved"] = torch.cuda.memory_reserved(self.runtime.device)
        return stats

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


# ----------------------------------------------------------------------------- training


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


# ----------------------------------------------------------------------------- CLI


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Train an NSA transformer (single process or torchrun).")
    d = TrainArgs()
    model = p.add_argument_group("model (unset: the NSAConfig default)")
    model.add_argument("--layers", type=int, help="n_layers")
    model.add_argument("--dim", type=int, help="model width")
    model.add_argument("--heads", type=int, help="query heads (n_heads)")
    model.add_argument("--kv-heads", type=int, help="key/value heads (n_kv_heads)")
    model.add_argument("--head-dim", type=int)
    model.add_argument("--backend", choices=BACKENDS, default=d.backend)
    model.add_argument("--grad-ckpt", action="store_true", help="checkpoint every block")
    model.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE",
                       help="any NSAConfig field (int/float/bool/a,b tuple), applied last")
    opt = p.add_argument_group("optimisation")
    opt.add_argument("--seq-len", type=int, default=d.seq_len)
    opt.add_argument("--batch", type=int, default=d.batch, help="sequences per rank per step")
    opt.add_argument("--steps", type=int, default=d.steps, help="schedule length")
    opt.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    opt.add_argument("--min-lr", type=float, default=d.min_lr, help="final cosine lr")
    opt.add_argument("--warmup", type=int, default=d.warmup, help="linear warm-up steps")
    opt.add_argument("--weight-decay", type=float, default=d.weight_decay)
    opt.add_argument("--grad-clip", type=float, default=d.grad_clip, help="0: no clipping")
    opt.add_argument("--dtype", choices=TRAIN_DTYPES, default=d.dtype,
                     help="bfloat16: autocast, parameters stay float32")
    opt.add_argument("--seed", type=int, default=d.seed)
    run = p.add_argument_group("data and run")
    run.add_argument("--data", choices=("synthetic", "text"), default=d.data)
    run.add_argument("--text-path", help="byte text for --data text (default: shipped KJV)")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    run.add_argument("--out", help="directory for checkpoint.pt and heartbeats")
    run.add_argument("--save-every", type=int, default=d.save_every,
                     help="checkpoint every N steps (and always at the end) when --out")
    run.add_argument("--stop-at", type=int, help="end this invocation after step N "
                     "(checkpointing), keeping the --steps schedule")
    run.add_argument("--resume", help="checkpoint PATH, or auto: OUT/checkpoint.pt if present")
    run.add_argument("--heartbeat", help="JSONL path (default OUT/heartbeat-rank{r}.jsonl)")
    run.add_argument("--pg-timeout", type=float, default=d.pg_timeout,
                     help="process-group timeout in seconds")
    run.add_argument("--log-every", type=int, default=d.log_every, help="0: quiet")
    run.add_argument("--threads", type=int, default=d.threads,
                     help="torch CPU threads (0: torch's default); 1 is fastest on a busy host")
    return p


def parse_args(argv: Sequence[str] | None = None) -> TrainArgs:
    """CLI words -> TrainArgs; raises UsageError on any syntax error."""
    namespace = build_parser().parse_args(argv)
    values = vars(namespace)
    values["overrides"] = parse_overrides(values["overrides"])
    return TrainArgs(**values)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 on any usage error)."""
    try:
        summary = train(parse_args(argv))
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    _report(summary)
    return 0


def _report(summary: dict[str, Any]) -> None:
    if summary["rank"] != 0:
        return
    losses = summary["losses"]
    final = f"final loss {losses[-1]:.4f}, " if losses else ""
    print(f"{PROG}: done at step {summary['step']}: {final}"
          f"{summary['tokens_per_s']:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
