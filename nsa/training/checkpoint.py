"""Checkpoints: the full training state written atomically, restored for an exact resume
(the resumed run's losses match the uninterrupted run's, bit for bit on CPU)."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path
from typing import Any

import torch

from nsa.config import NSAConfig
from nsa.model import NSATransformer
from nsa.training.options import TrainArgs, UsageError

CHECKPOINT_NAME = "checkpoint.pt"
# Fields that may differ between a checkpoint and the run resuming it: they change how the
# model is computed, not what its parameters mean.
RUNTIME_FIELDS = frozenset({"backend", "query_chunk", "grad_ckpt", "dtype"})


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
