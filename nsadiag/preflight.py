"""What a command checks before it creates anything, so a rejected command leaves nothing.

Each function raises ValueError with one line naming the option: ``check_target`` (the
target resolves and accepts its knobs), ``check_device`` (the device exists here),
``check_ddp`` (world size, DDP backend, process-group timeout and devices can run here).
Commands call them before their run directory is made.
"""

from __future__ import annotations

import math

from nsadiag.spec import DDP_BACKENDS, TrialSpec


def check_target(spec: TrialSpec) -> None:
    """Fail fast on a config the child would refuse: a bad NSAConfig field (checked here:
    nsa is nsadiag's own code), an unknown target, or a knob its factory does not accept
    (found by importing the target in a watched child: nsadiag.harness.targetcheck; a
    target that fails or stalls while being imported is left to the trials' verdicts)."""
    if spec.target == "nsa":
        from nsadiag.builtin import require_builtin_nsa

        require_builtin_nsa()
        from nsa.config import NSAConfig

        knobs = {name: getattr(spec, name) for name in ("n_layers", "branches", "backend")
                 if getattr(spec, name) is not None}
        NSAConfig().replace(**spec.overrides, **knobs)
        return
    from nsadiag.harness.targetcheck import inspect_target

    problem = inspect_target(spec).problem
    if problem:
        raise ValueError(problem)


def check_device(spec: TrialSpec) -> None:
    """ValueError unless the spec's device exists on this machine."""
    from nsadiag.targets import resolve_device

    resolve_device(spec.device)


def check_ddp(spec: TrialSpec, world_size: int, backend: str,
              pg_timeout_s: float | None = None) -> None:
    """ValueError (one line) for a world size, DDP backend, process-group timeout or device
    that cannot run here."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world-size: must be an integer >= 1, got {world_size!r}")
    if backend not in DDP_BACKENDS:
        raise ValueError(f"ddp-backend: must be one of {', '.join(DDP_BACKENDS)}, got "
                         f"{backend!r}")
    if pg_timeout_s is not None and not (isinstance(pg_timeout_s, (int, float))
                                         and math.isfinite(pg_timeout_s) and pg_timeout_s > 0):
        raise ValueError(f"pg-timeout: must be a positive number of seconds, got "
                         f"{pg_timeout_s!r}")
    if backend == "gloo":
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError("ddp-backend: nccl needs CUDA, and torch.cuda.is_available() is "
                         "False on this machine; use --ddp-backend gloo")
    if spec.device == "cpu":
        raise ValueError("device: nccl runs on CUDA tensors; use --device cuda or auto")
    if world_size > torch.cuda.device_count():
        raise ValueError(f"world-size: nccl needs one GPU per rank, and this machine has "
                         f"{torch.cuda.device_count()} (asked for {world_size})")
