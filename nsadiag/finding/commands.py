"""The commands a finding hands back to its reader: the trial options that repeat a trial
(``trial_options``), the command of the smallest failing trial (``reproduce``), the check
that failed alone (``check_command``).

A spec built on a preset (nsadiag.spec.PRESETS) is written back as ``--preset NAME`` with
only the ``--set`` overrides the preset does not hold.
"""

from __future__ import annotations

from typing import Any

from nsadiag.recordspec import RecordSpec
from nsadiag.spec import PRESETS, STALL_TIMEOUT_S, preset_of


def cli_value(value: Any) -> str:
    """An override as `--set` reads it back: lists and tuples as a,b."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def shape_options(spec: RecordSpec) -> list[str]:
    """--preset and --set options of a spec's overrides (the built-in target's preset when
    its overrides hold one)."""
    overrides = dict(spec.overrides)
    args: list[str] = []
    preset = preset_of(overrides) if (spec.target or "nsa") == "nsa" else None
    if preset is not None:
        args += ["--preset", preset]
        overrides = {k: v for k, v in overrides.items()
                     if k not in PRESETS[preset] or PRESETS[preset][k] != v}
    for key, value in sorted(overrides.items()):
        args += ["--set", f"{key}={cli_value(value)}"]
    return args


def trial_options(spec: RecordSpec, layers: bool = True) -> list[str]:
    """The command-line options that give a trial this spec (every knob, so the command
    reproduces it whatever the defaults). ValueError for a spec that is not a trial's
    (a user's command)."""
    knobs = (spec.target, spec.seq_len, spec.batch, spec.dtype, spec.device, spec.steps,
             spec.seed, spec.stall_timeout_s, spec.budget_s)
    if any(knob is None for knob in knobs):
        raise ValueError("spec: not a trial's spec (it lacks the trial's knobs)")
    args = ["--target", str(spec.target)]
    if layers and spec.n_layers is not None:
        args += ["--layers", str(spec.n_layers)]
    args += ["--seq-len", str(spec.seq_len), "--batch", str(spec.batch),
             "--dtype", str(spec.dtype), "--device", str(spec.device),
             "--steps", str(spec.steps), "--seed", str(spec.seed),
             "--stall-timeout", f"{spec.stall_timeout_s:g}", "--budget",
             f"{spec.budget_s:g}"]
    if spec.backend:
        args += ["--backend", spec.backend]
    if spec.grad_ckpt:
        args.append("--grad-ckpt")
    if spec.memory_cap_bytes:
        args += ["--memory-cap-mb", str(spec.memory_cap_bytes // 2**20)]
    return args + shape_options(spec)


def reproduce(spec: RecordSpec) -> list[str]:
    """The command of one trial: isolate-branch when one branch was computed, else
    sweep-layers at its one layer count."""
    branches = spec.branches
    head = (["nsadiag", "isolate-branch", branches[0]] if branches and len(branches) == 1
            else ["nsadiag", "sweep-layers"])
    return [*head, *trial_options(spec)]


def check_command(name: str, spec: RecordSpec, n_layers: int | None,
                  world_size: int = 2) -> list[str]:
    """The failing check alone, with the trial options `nsadiag check` takes."""
    command = ["nsadiag", "check", name, "--target", spec.target or "nsa"]
    if n_layers is not None:
        command += ["--layers", str(n_layers)]
    stall_timeout_s = STALL_TIMEOUT_S if spec.stall_timeout_s is None else spec.stall_timeout_s
    command += ["--seq-len", str(spec.seq_len), "--batch", str(spec.batch),
                "--device", str(spec.device), "--stall-timeout", f"{stall_timeout_s:g}",
                "--seed", str(spec.seed or 0)]
    if spec.backend:
        command += ["--backend", spec.backend]
    if name == "ddp":
        command += ["--world-size", str(world_size)]
    return command + shape_options(spec)
