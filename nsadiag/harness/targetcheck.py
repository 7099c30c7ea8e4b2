"""A user's target imported in a watched child under a deadline, never in nsadiag's own
process: what its factory accepts, and whether the spec's knobs and overrides fit it.

``inspect_target(spec)`` runs the "target" job (nsadiag.harness.child, nsadiag.targets.
describe_target) through the one watcher: a module that blocks at import is stopped at the
stall limit (the stall timeout, at least the watcher's start-up grace) with its stacks
taken, one that raises or calls sys.exit() ends as ERROR naming it; neither can hang or end
nsadiag. The answer is cached per target, knobs and overrides for the life of the process.

The commands use it to fail fast on what the user typed: a missing module or factory, a
knob or override the factory does not take (one-line ValueError, exit 2, before any run
directory is written). When the child did not end OK (the module raised, exited or
stalled while being imported), the commands go on: their first trial or check imports the
target again in its own watched child, and that child's verdict (ERROR naming the
exception or the exit, or a stall verdict with the import's stacks) is what the report
gives. A module that blocks at import therefore costs the stall limit twice.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nsadiag.harness.jobs import run_job
from nsadiag.spec import JobSpec, TrialSpec

TARGET_CHECK_BUDGET_S = 300.0
"""Wall-clock limit of the check: importing a large user package on a loaded machine is
slow, but a module that keeps importing for minutes is reported as SLOW by its trial."""


@dataclass(frozen=True)
class TargetInfo:
    """What the child found. ``verdict`` is its verdict ("OK" when it imported the target
    and checked the knobs); ``accepts`` the keyword parameters the factory declares and
    ``problem`` the one-line error the spec's knobs or overrides raise (both None unless
    the verdict is OK); ``reason`` the verdict's first reason."""

    verdict: str
    reason: str
    accepts: tuple[str, ...] | None = None
    open_ended: bool = False
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "OK"


_cache: dict[str, TargetInfo] = {}


def _key(spec: TrialSpec) -> str:
    knobs = {k: getattr(spec, k) for k in ("n_layers", "branches", "backend", "grad_ckpt",
                                           "dtype", "seq_len", "seed")}
    return repr((spec.target, sorted(spec.overrides.items()), sorted(knobs.items())))


def inspect_target(spec: TrialSpec) -> TargetInfo:
    """Import ``spec.target`` ("pkg.module:factory") in a watched child and describe it
    (see the module docstring). Not for the built-in "nsa" target (nsadiag's own code)."""
    if spec.target == "nsa":
        raise ValueError("target: the built-in nsa target is checked in this process")
    key = _key(spec)
    if key in _cache:
        return _cache[key]
    directory = Path(tempfile.mkdtemp(prefix="nsadiag-target-"))
    try:
        job = JobSpec("target", spec.replace(out_dir=str(directory / "job"),
                                              budget_s=TARGET_CHECK_BUDGET_S,
                                              memory_cap_bytes=None, steps=1))
        record = run_job(job)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    result = record.evidence.result if record.evidence is not None else None
    found = (result or {}).get("target") or {}
    reasons = record.verdict.reasons or [""]
    if record.verdict_name == "OK":
        info = TargetInfo("OK", reasons[0], tuple(found.get("accepts") or ()),
                          bool(found.get("open_ended")), found.get("problem"))
    else:
        info = TargetInfo(record.verdict_name, reasons[0])
    _cache[key] = info
    return info


def require_importable(spec: TrialSpec) -> None:
    """For a command that runs the target in its own process (trace, memory): ValueError
    (one line) unless a watched child imported it and its factory takes the spec's knobs,
    so user code that raises, exits or blocks at import never does so in nsadiag."""
    if spec.target == "nsa":
        return
    info = inspect_target(spec)
    if info.problem:
        raise ValueError(info.problem)
    if not info.ok:
        module = spec.target.partition(":")[0]
        raise ValueError(f"target: importing {module!r} in a watched child ended "
                         f"{info.verdict}: {info.reason}; this command runs the target in "
                         f"its own process, so it stops here (`nsadiag sweep-layers --target "
                         f"{spec.target}` reports it from watched children)")
