"""The commands a finding hands back to its reader: the trial options that repeat a trial
(``trial_options``), the command of the smallest failing trial (``reproduce``), the check
that failed alone (``check_command``).

A spec built on a preset (nsadiag.spec.PRESETS) is written back as ``--preset NAME`` with
only the ``--set`` overrides the preset does not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nsadiag.spec import PRESETS, STALL_TIMEOUT_S, preset_of


def cli_value(value: Any) -> str:
    """An override as `--set` reads it back: lists and tuples as a,b."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def shape_options(spec: Mapping[str, Any]) -> list[str]:
    """--preset and --set options of a spec's overrides (the built-in target's preset when
    its overrides hold one)."""
    overrides = dict(spec.get("overrides") or {})
    args: list[str] = []
    preset = preset_of(overrides) if spec.get("target", "nsa") == "nsa" else None
    if preset is not None:
        args += ["--preset", preset]
        overrides = {k: v for k, v in overrides.items()
                     if k not in PRESETS[preset] or PRESETS[preset][k] != v}
    for key, value in sorted(overrides.items()):
        args += ["--set", f"{key}={cli_value(value)}"]
    return args


def trial_options(spec: Mapping[str, Any], layers: bool = True) -> list[str]:
    """The command-line options that give a trial this spec (every knob, so the command
    reproduces it whatever the defaults)."""
    args = ["--target", spec["target"]]
    if layers and spec.get("n_layers") is not None:
        args += ["--layers", str(spec["n_layers"])]
    args += ["--seq-len", str(spec["seq_len"]), "--batch", str(spec["batch"]),
             "--dtype", spec["dtype"], "--device", spec["device"],
             "--steps", str(spec["steps"]), "--seed", str(spec["seed"]),
             "--stall-timeout", f"{spec['stall_timeout_s']:g}", "--budget",
             f"{spec['budget_s']:g}"]
    if spec.get("backend"):
        args += ["--backend", spec["backend"]]
    if spec.get("grad_ckpt"):
        args.append("--grad-ckpt")
    if spec.get("memory_cap_bytes"):
        args += ["--memory-cap-mb", str(spec["memory_cap_bytes"] // 2**20)]
    return args + shape_options(spec)


def reproduce(spec: Mapping[str, Any]) -> list[str]:
    """The command of one trial: isolate-branch when one branch was computed, else
    sweep-layers at its one layer count."""
    branches = spec.get("branches")
    head = (["nsadiag", "isolate-branch", branches[0]] if branches and len(branches) == 1
            else ["nsadiag", "sweep-layers"])
    return [*head, *trial_options(spec)]


def check_command(name: str, spec: Mapping[str, Any], n_layers: int | None,
                  world_size: int = 2) -> list[str]:
    """The failing check alone, with the trial options `nsadiag check` takes."""
    command = ["nsadiag", "check", name, "--target", spec.get("target", "nsa")]
    if n_layers is not None:
        command += ["--layers", str(n_layers)]
    command += ["--seq-len", str(spec.get("seq_len")), "--batch", str(spec.get("batch")),
                "--device", str(spec.get("device")),
                "--stall-timeout", f"{spec.get('stall_timeout_s', STALL_TIMEOUT_S):g}",
                "--seed", str(spec.get("seed", 0))]
    if spec.get("backend"):
        command += ["--backend", spec["backend"]]
    if name == "ddp":
        command += ["--world-size", str(world_size)]
    return command + shape_options(spec)
