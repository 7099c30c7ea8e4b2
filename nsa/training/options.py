"""Options of `python -m nsa.train`: the typed arguments, their checks and the parser.

Every bad option raises UsageError with one line naming the option or field; the entry point
prints it as `nsa.train: error: ...` and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nsa.config import BACKENDS, NSAConfig
from nsa.data import default_text_path

PROG = "nsa.train"
TRAIN_DTYPES = ("float32", "bfloat16")


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
