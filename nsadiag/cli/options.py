"""The command line's options, each declared once.

Every option a command shares is an annotated type here (``Target``, ``SeqLen``,
``Dtype``, ...): its flag, its help and its choices. The options of a trial are gathered by
``trial_options`` — a decorator that adds the trial options a command takes to its
signature (with defaults taken from ``TrialSpec``, or the command's own) and hands the
command one ``TrialOptions`` object, whose ``spec()`` builds the ``TrialSpec``. A new
trial option is one entry in ``TRIAL_OPTIONS`` and one field of ``TrialOptions``.

Nothing here imports torch, pandas or the built-in ``nsa``: `nsadiag --help` must not wait.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from typer.core import TyperOption

from nsadiag import limits
from nsadiag.rundir import check_out, default_run_dir
from nsadiag.spec import (
    BRANCHES,
    CHECK_NAMES,
    DDP_BACKENDS,
    DEVICES,
    DTYPES,
    PRESETS,
    TrialSpec,
    parse_overrides,
    preset_overrides,
)

NSA_BACKENDS = ("naive", "torch", "triton", "auto")
"""The built-in model's attention backends (nsa.config.BACKENDS, not imported here)."""
SPEC_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrialSpec)
                 if f.default is not dataclasses.MISSING}
TRIAL = "Trial options"
OUTPUT = "Output"

# ---- how --help shows an option's type ----------------------------------------------------

_typer_display_type = TyperOption.display_type_rich


def _display_type(option: TyperOption, ctx: Any) -> str | None:
    """The type column of --help: none for a flag (typer shows ``<bool>`` there, as if
    the flag took a value)."""
    return None if option.is_flag else _typer_display_type(option, ctx)


TyperOption.display_type_rich = _display_type  # type: ignore[method-assign]

# ---- shared option types -------------------------------------------------------------------

Target = Annotated[str, typer.Option(
    "--target", help='The model: "nsa" (the built-in NSA transformer) or a factory '
                     '"pkg.module:factory".', rich_help_panel=TRIAL)]
Preset = Annotated[Literal[tuple(PRESETS)] | None, typer.Option(
    "--preset", help="The built-in model's shape: tiny (a triage in minutes on two CPU "
    "cores), small, or paper (the paper's attention hyper-parameters); --set overrides "
    "its fields.", rich_help_panel=TRIAL)]
Set = Annotated[list[str] | None, typer.Option(
    "--set", metavar="KEY=VALUE", help="Override a config field or factory argument "
    "(repeatable), e.g. --set dim=256.", rich_help_panel=TRIAL)]
Layers = Annotated[int | None, typer.Option(
    "--layers", min=1, help="Number of layers (default: the target's own).",
    rich_help_panel=TRIAL)]
LayerRange = Annotated[str, typer.Option(
    "--layers", help='Layer counts: "1-12", "1,2,4" or "2-12:2".', rich_help_panel=TRIAL)]
SeqLen = Annotated[int, typer.Option("--seq-len", min=1, help="Tokens per sequence.",
                                     rich_help_panel=TRIAL)]
Batch = Annotated[int, typer.Option("--batch", min=1, help="Sequences per step (per rank).",
                                    rich_help_panel=TRIAL)]
Dtype = Annotated[Literal[DTYPES], typer.Option(
    "--dtype", help="float32, or bfloat16 autocast (parameters stay float32).",
    rich_help_panel=TRIAL)]
GradCkpt = Annotated[bool, typer.Option("--grad-ckpt/--no-grad-ckpt",
                                        help="Gradient checkpointing per block.",
                                        rich_help_panel=TRIAL)]
Device = Annotated[Literal[DEVICES], typer.Option(
    "--device", help="auto = cuda when available.", rich_help_panel=TRIAL)]
Backend = Annotated[str | None, typer.Option(
    "--backend", metavar="<" + "|".join(NSA_BACKENDS) + ">",
    help="NSA attention backend (default: the target's own; a factory that declares "
         "`backend` may accept its own names).", rich_help_panel=TRIAL)]
Steps = Annotated[int, typer.Option("--steps", min=1, help="Training steps per trial.",
                                    rich_help_panel=TRIAL)]
Seed = Annotated[int, typer.Option("--seed", help="Seed of torch and random.",
                                   rich_help_panel=TRIAL)]
StallTimeout = Annotated[float, typer.Option(
    "--stall-timeout", help="Seconds without progress before the trial is stopped "
    "and its stacks sampled.", rich_help_panel=TRIAL)]
StartupGrace = Annotated[float, typer.Option(
    "--startup-grace", help="Seconds a trial may take to start (import torch and the "
    "target, build the model) before the stall timeout applies.", rich_help_panel=TRIAL)]
Budget = Annotated[float, typer.Option(
    "--budget", help="Seconds a trial may run; still progressing then = SLOW.",
    rich_help_panel=TRIAL)]
NoLimits = Annotated[bool, typer.Option(
    "--no-limits", help="Run sizes beyond this machine's limits (ranks per CPU, layers, "
    "trials per sweep, tokens per memory) instead of refusing them.", rich_help_panel=TRIAL)]
MemoryCapMb = Annotated[int | None, typer.Option(
    "--memory-cap-mb", min=1, help="Address-space cap of each trial child (MiB).",
    rich_help_panel=TRIAL)]
WorldSize = Annotated[int, typer.Option("--world-size", min=1, help="Ranks (processes).")]
DdpBackend = Annotated[Literal[DDP_BACKENDS], typer.Option(
    "--ddp-backend", help="Process-group backend: gloo (CPU) or nccl (one GPU per rank).")]
Branch = Annotated[Literal[BRANCHES], typer.Argument(help="The NSA branch to isolate.")]
CheckName = Annotated[Literal[(*CHECK_NAMES, "all")], typer.Argument(
    help="The check to run, or all.")]
Out = Annotated[str | None, typer.Option(
    "--out", help="Run directory (default: runs/TIME-COMMAND, TIME in UTC); an existing one "
                  "resumes.", rich_help_panel=OUTPUT)]
NoRedact = Annotated[bool, typer.Option(
    "--no-redact", help="Keep host names, IPs, user names and secrets in the report, the "
                        "summary and the terminal.", rich_help_panel=OUTPUT)]
AsJson = Annotated[bool, typer.Option("--json", help="Print summary.json instead of tables.",
                                      rich_help_panel=OUTPUT)]


def run_dir(out: str | None, command: str) -> Path:
    """The run directory of --out, or runs/<UTC time>-<command>; ValueError for --out ""."""
    return default_run_dir(command) if out is None else check_out(out)


# ---- the trial options object ----------------------------------------------------------------


@dataclasses.dataclass
class TrialOptions:
    """The trial options of one command line; unset ones keep TrialSpec's defaults."""

    target: str = SPEC_DEFAULTS["target"]
    preset: str | None = None
    set_: list[str] | None = None
    seq_len: int = SPEC_DEFAULTS["seq_len"]
    batch: int = SPEC_DEFAULTS["batch"]
    dtype: str = SPEC_DEFAULTS["dtype"]
    grad_ckpt: bool = SPEC_DEFAULTS["grad_ckpt"]
    device: str = SPEC_DEFAULTS["device"]
    backend: str | None = SPEC_DEFAULTS["backend"]
    steps: int = SPEC_DEFAULTS["steps"]
    seed: int = SPEC_DEFAULTS["seed"]
    stall_timeout: float = SPEC_DEFAULTS["stall_timeout_s"]
    budget: float = SPEC_DEFAULTS["budget_s"]
    startup_grace: float = SPEC_DEFAULTS["startup_grace_s"]
    memory_cap_mb: int | None = None
    no_limits: bool = False

    def spec(self, **changes: Any) -> TrialSpec:
        """The validated TrialSpec (``changes`` applied: n_layers, branches, ...);
        ValueError (one line naming the option or field) for a value it refuses, or for
        a size beyond this machine's limits (nsadiag.limits) unless ``no_limits``."""
        for name, value in (("stall-timeout", self.stall_timeout), ("budget", self.budget),
                            ("startup-grace", self.startup_grace)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be > 0 seconds, got {value:g}")
        overrides = {**preset_overrides(self.preset, self.target),
                     **parse_overrides(self.set_ or [])}
        spec = TrialSpec(target=self.target, overrides=overrides,
                         seq_len=self.seq_len, batch=self.batch, dtype=self.dtype,
                         grad_ckpt=self.grad_ckpt, device=self.device, backend=self.backend,
                         steps=self.steps, seed=self.seed, stall_timeout_s=self.stall_timeout,
                         budget_s=self.budget, startup_grace_s=self.startup_grace,
                         memory_cap_bytes=(self.memory_cap_mb * 2**20 if self.memory_cap_mb
                                           else None))
        spec = dataclasses.replace(spec, **changes).validate()
        if not self.no_limits:
            limits.check_layers(spec.n_layers)
            limits.check_tokens(spec.seq_len, spec.batch)
        return spec

    def within_limits(self, check: Callable[..., None], *args: Any) -> None:
        """Run one of nsadiag.limits' checks unless --no-limits was given."""
        if not self.no_limits:
            check(*args)


TRIAL_OPTIONS: dict[str, tuple[Any, Any]] = {
    "target": (Target, SPEC_DEFAULTS["target"]), "preset": (Preset, None),
    "set_": (Set, None),
    "seq_len": (SeqLen, SPEC_DEFAULTS["seq_len"]), "batch": (Batch, SPEC_DEFAULTS["batch"]),
    "dtype": (Dtype, SPEC_DEFAULTS["dtype"]), "grad_ckpt": (GradCkpt, SPEC_DEFAULTS["grad_ckpt"]),
    "device": (Device, SPEC_DEFAULTS["device"]), "backend": (Backend, SPEC_DEFAULTS["backend"]),
    "steps": (Steps, SPEC_DEFAULTS["steps"]), "seed": (Seed, SPEC_DEFAULTS["seed"]),
    "stall_timeout": (StallTimeout, SPEC_DEFAULTS["stall_timeout_s"]),
    "budget": (Budget, SPEC_DEFAULTS["budget_s"]),
    "startup_grace": (StartupGrace, SPEC_DEFAULTS["startup_grace_s"]),
    "memory_cap_mb": (MemoryCapMb, None),
    "no_limits": (NoLimits, False),
}
"""Parameter name -> (annotated type, default): every trial option a command may take."""
ALL_TRIAL = tuple(TRIAL_OPTIONS)
IN_PROCESS = ("target", "preset", "set_", "seq_len", "batch", "dtype", "grad_ckpt", "device",
              "backend", "no_limits")
"""What a command that runs the target in its own process (memory, trace) can use."""


def trial_options(names: tuple[str, ...] = ALL_TRIAL, **defaults: Any
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the trial options ``names`` (``defaults`` overriding TrialSpec's)
    and call it with ``trial=TrialOptions(...)`` in their place."""
    unknown = sorted((set(names) | set(defaults)) - set(TRIAL_OPTIONS))
    if unknown:
        raise ValueError(f"trial_options: no trial option {unknown[0]!r}")

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "trial"]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                   annotation=TRIAL_OPTIONS[name][0],
                                   default=defaults.get(name, TRIAL_OPTIONS[name][1]))
                 for name in names]

        @functools.wraps(command)
        def with_trial(**kwargs: Any) -> Any:
            trial = TrialOptions(**{name: kwargs.pop(name) for name in names})
            return command(trial=trial, **kwargs)

        parameters = own + added
        with_trial.__signature__ = signature.replace(parameters=parameters)  # type: ignore
        with_trial.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_trial

    return wrap
