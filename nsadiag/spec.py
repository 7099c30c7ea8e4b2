"""TrialSpec: everything one trial (one child process, one configuration) needs to run.

A spec is frozen and travels as JSON: the parent writes it next to the trial directory and
the child reads it back (inside the job spec below). `validate()` raises
ValueError with one line that names the field and the allowed values.

Knobs that the trial itself controls (n_layers, seq_len, grad_ckpt, dtype, branches,
backend, device, seed) are spec fields; `overrides` carries everything else, passed to
`NSAConfig.replace` for the built-in "nsa" target or as keyword arguments to a factory.
Naming a knob inside `overrides` is refused, so one value never silently beats another.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16")
DEVICES = ("cpu", "cuda", "auto")
BRANCHES = ("cmp", "sel", "win")
KNOBS = ("n_layers", "seq_len", "grad_ckpt", "dtype", "device", "branches", "backend", "seed")
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
STARTUP_GRACE_S = 30.0
"""Until a job's first forward its stall limit is at least this: starting Python,
importing torch and the target and building the model go by without a module event."""
STALL_TIMEOUT_S = 60.0
"""The default stall timeout of every command and of ``nsadiag.watch()``: no progress for
this long is a stall. A step of the paper-sized model on a CPU takes seconds; a minute
without one module event is far outside what a working run shows."""
WATCH_POLL_S = 0.2
"""How often the parent loops (a trial's job, `nsadiag run`, the watch helper, the reaper)
read their streams and check the process: a stall is declared at most this late."""


@dataclass(frozen=True)
class TrialSpec:
    """One trial: the target, its shape, how many steps, and the limits it runs under.

    target           "nsa" or "pkg.module:factory"
    overrides        NSAConfig fields (target "nsa") or factory keyword arguments
    n_layers         number of repeated blocks; None keeps the target's own default
    seq_len, batch   token ids per step are [batch, seq_len + 1] (inputs and next tokens)
    dtype            "float32", or "bfloat16" (autocast; parameters stay fp32)
    grad_ckpt        gradient checkpointing per block
    branches         NSA branches to build, a subset of cmp/sel/win; None = all
    backend          NSA backend name; None keeps the target's default
    device           "cpu", "cuda" or "auto" (cuda when available)
    steps, seed      training steps to run; the seed of torch and random
    stall_timeout_s  the parent's limit on silence (no heartbeat event) before it acts
    budget_s         the parent's limit on the whole trial's wall time
    startup_grace_s  until the first forward the stall limit is at least this
    memory_cap_bytes RLIMIT_AS of the child (address space, not resident memory); None = none
    out_dir          the trial directory: events.jsonl, result.json, faulthandler.txt
    """

    target: str = "nsa"
    overrides: dict[str, Any] = field(default_factory=dict)
    n_layers: int | None = None
    seq_len: int = 128
    batch: int = 1
    dtype: str = "float32"
    grad_ckpt: bool = False
    branches: tuple[str, ...] | None = None
    backend: str | None = None
    device: str = "cpu"
    steps: int = 2
    seed: int = 0
    stall_timeout_s: float = STALL_TIMEOUT_S
    budget_s: float = 600.0
    startup_grace_s: float = STARTUP_GRACE_S
    memory_cap_bytes: int | None = None
    out_dir: str = "trial"

    def __post_init__(self) -> None:
        if isinstance(self.branches, (list, str)):
            value = (self.branches,) if isinstance(self.branches, str) else self.branches
            object.__setattr__(self, "branches", tuple(value))
        object.__setattr__(self, "out_dir", str(self.out_dir))

    def validate(self) -> TrialSpec:
        """Return self, or raise ValueError (one line naming the field and what it allows)."""
        _check_target(self.target)
        _check_overrides(self.overrides)
        if self.n_layers is not None:
            _check_positive_int("n_layers", self.n_layers, "a positive integer or null")
        for name in ("seq_len", "batch", "steps"):
            _check_positive_int(name, getattr(self, name), "a positive integer")
        _check_int("seed", self.seed)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("device", self.device, DEVICES)
        _check_bool("grad_ckpt", self.grad_ckpt)
        _check_branches(self.branches)
        if self.backend is not None and (not isinstance(self.backend, str) or not self.backend):
            raise ValueError(f"backend: must be a backend name or null, got {self.backend!r}")
        for name in ("stall_timeout_s", "budget_s", "startup_grace_s"):
            _check_positive_number(name, getattr(self, name))
        if self.memory_cap_bytes is not None:
            _check_positive_int("memory_cap_bytes", self.memory_cap_bytes,
                                "a positive integer (bytes) or null")
        if not self.out_dir:
            raise ValueError("out_dir: must be a directory path, got ''")
        return self

    def replace(self, **changes: Any) -> TrialSpec:
        """A validated copy with `changes`."""
        return dataclasses.replace(self, **changes).validate()

    def to_dict(self) -> dict[str, Any]:
        """The spec's JSON form as a dict, keys sorted (branches a list)."""
        data = dataclasses.asdict(self)
        data["branches"] = list(self.branches) if self.branches is not None else None
        return dict(sorted(data.items()))

    def to_json(self) -> str:
        """JSON text that `from_json` reads back into an equal spec."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, source: str | Path) -> TrialSpec:
        """A validated spec from JSON text or from a path to a JSON file.

        A str that starts with "{" is JSON text; anything else is a path. Unknown keys,
        unreadable files and invalid JSON raise ValueError (one line).
        """
        text = _read_source(source)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"spec: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"spec: must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{unknown[0]}: not a TrialSpec field; fields are "
                             f"{', '.join(sorted(names))}")
        return cls(**data).validate()


def _read_source(source: str | Path) -> str:
    if isinstance(source, str) and source.lstrip().startswith("{"):
        return source
    try:
        return Path(source).read_text()
    except OSError as exc:
        raise ValueError(f"spec: cannot read {str(source)!r}: {exc.strerror}") from None


def _check_target(target: Any) -> None:
    if target == "nsa" or (isinstance(target, str) and _FACTORY.match(target)):
        return
    raise ValueError(f"target: must be 'nsa' or 'pkg.module:factory', got {target!r}")


def _check_overrides(overrides: Any) -> None:
    if not isinstance(overrides, dict) or not all(isinstance(k, str) for k in overrides):
        raise ValueError(f"overrides: must be a mapping of names to values, got {overrides!r}")
    knobs = sorted(set(overrides) & set(KNOBS))
    if knobs:
        raise ValueError(f"overrides: {knobs[0]!r} is a TrialSpec field; set it there "
                         f"(spec fields: {', '.join(KNOBS)})")


def _check_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name}: must be an integer, got {value!r}")


def _check_positive_int(name: str, value: Any, allowed: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: must be {allowed}, got {value!r}")


def _check_positive_number(name: str, value: Any) -> None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not value > 0:
        raise ValueError(f"{name}: must be a positive number of seconds, got {value!r}")


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: must be one of {', '.join(allowed)}, got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: must be true or false, got {value!r}")


def _check_branches(branches: tuple[str, ...] | None) -> None:
    if branches is None:
        return
    valid = all(b in BRANCHES for b in branches) and len(set(branches)) == len(branches)
    if not branches or not valid:
        raise ValueError(f"branches: must be null or a non-empty subset of "
                         f"{', '.join(BRANCHES)} without repeats, got {list(branches)!r}")


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(dim=32, n_heads=4, n_kv_heads=2, head_dim=8, l=8, d=4, l_sel=16, n_sel=3,
                 w=32),
    "small": dict(dim=256, n_heads=4, n_kv_heads=2, head_dim=64, l=16, d=8, l_sel=32,
                  n_sel=8, w=256),
    "paper": dict(dim=512, n_heads=8, n_kv_heads=2, head_dim=64, l=32, d=16, l_sel=64,
                  n_sel=16, w=512),
}
"""Shapes of the built-in model by name (``--preset``), as NSAConfig overrides: ``tiny``
runs a triage in minutes on two CPU cores, ``small`` is a laptop-sized model, ``paper`` the
paper's attention hyper-parameters (l=32, d=16, l_sel=64, n_sel=16, w=512) at NSAConfig's
default width. ``--set`` overrides a preset's fields."""


def preset_overrides(preset: str | None, target: str) -> dict[str, Any]:
    """The overrides of ``preset`` ({} for None); ValueError (one line) for an unknown
    name, or a preset asked for a target other than the built-in "nsa"."""
    if preset is None:
        return {}
    _check_choice("preset", preset, tuple(PRESETS))
    if target != "nsa":
        raise ValueError(f"preset: shapes the built-in target nsa only; {target} takes its "
                         f"own arguments with --set")
    return dict(PRESETS[preset])


def preset_of(overrides: dict[str, Any]) -> str | None:
    """The preset ``overrides`` were built on: every field of it set, most of them to its
    values (``--preset tiny --set w=16``); the one with the most equal fields, None when
    none fits."""
    scores = {name: sum(overrides[key] == value for key, value in shape.items())
              for name, shape in PRESETS.items() if set(shape) <= set(overrides)}
    fitting = {name: n for name, n in scores.items() if 2 * n > len(PRESETS[name])}
    return max(fitting, key=fitting.__getitem__) if fitting else None


JOB_KINDS = ("trial", "check", "memory", "target")
DDP_BACKENDS = ("gloo", "nccl")
CHECK_NAMES = ("causality", "parity", "ckpt", "ddp")


@dataclass(frozen=True)
class JobSpec:
    """What one watched child (or each rank of a torchrun job) runs: the one JSON file a
    child of nsadiag.harness.child reads.

    kind         "trial" (train spec.steps steps), "check" (the correctness check named
                 `check`), "memory" (the memory probe's measurement), "target" (import
                 the target and check the spec's knobs against its factory)
    spec         the TrialSpec: target, shape, limits, and the job directory (out_dir)
    world_size   processes; above 1 the job runs under torchrun, each rank in
                 <out_dir>/rank-<r>/
    torchrun     run under torchrun as ranks even with world_size 1: a DDP trial of one
                 rank (nsadiag ddp --world-size 1) wraps the model in DDP and counts its
                 collectives, and with nccl arms the Flight Recorder, all on one GPU
    ddp_backend  "gloo" or "nccl" (ranked jobs)
    pg_timeout_s the process-group timeout; None = nsadiag.harness.rank.pg_timeout_for
    check        the check's name (kind "check")
    top          rows of the largest saved tensors (kind "memory")
    """

    kind: str
    spec: TrialSpec
    world_size: int = 1
    torchrun: bool = False
    ddp_backend: str = "gloo"
    pg_timeout_s: float | None = None
    check: str | None = None
    top: int = 10

    @property
    def ranked(self) -> bool:
        """Whether the job runs under torchrun, each process a rank in <out_dir>/rank-<r>/."""
        return self.world_size > 1 or self.torchrun

    def validate(self) -> JobSpec:
        """Return self, or raise ValueError (one line naming the field)."""
        _check_choice("kind", self.kind, JOB_KINDS)
        self.spec.validate()
        _check_positive_int("world_size", self.world_size, "a positive integer")
        if not isinstance(self.torchrun, bool):
            raise ValueError(f"torchrun: must be true or false, got {self.torchrun!r}")
        _check_choice("ddp_backend", self.ddp_backend, DDP_BACKENDS)
        if self.pg_timeout_s is not None:
            _check_positive_number("pg_timeout_s", self.pg_timeout_s)
        if self.kind == "check":
            _check_choice("check", self.check, CHECK_NAMES)
        _check_positive_int("top", self.top, "a positive integer")
        return self

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["spec"] = json.loads(self.spec.to_json())
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, source: str | Path) -> JobSpec:
        """A validated job from JSON text or a path (see TrialSpec.from_json)."""
        text = _read_source(source)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"job: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
            raise ValueError("job: must be a JSON object with a 'spec' object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{unknown[0]}: not a JobSpec field; fields are "
                             f"{', '.join(sorted(names))}")
        spec = TrialSpec.from_json(json.dumps(data.pop("spec")))
        return cls(spec=spec, **data).validate()


def parse_set_value(text: str) -> Any:
    """One ``--set`` value: "true"/"false" a bool, "a,b" a tuple, then an int, a float,
    else the string itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "," in text:
        return tuple(parse_set_value(part) for part in text.split(",") if part)
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``--set key=value`` items -> {key: value} for ``TrialSpec.overrides`` (later items
    win); ValueError for an item without "=". The same syntax as ``python -m nsa.train
    --set``, parsed here so that no command imports the built-in ``nsa`` for a foreign
    target (see nsadiag.builtin)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set: expected key=value, got {item!r}")
        overrides[key.strip()] = parse_set_value(value.strip())
    return overrides
