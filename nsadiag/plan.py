"""How long a command can take at worst, said before it starts.

Every trial ends by its ``--budget`` at the latest (a stall ends it sooner), plus its
overhead: the stack samples after the kill and the teardown (TRIAL_OVERHEAD_S). The
defaults (S=2048, layers 1-12, 600 s per trial) can run for hours on a CPU; a command
whose worst case exceeds ANNOUNCE_S prints it, with the options that bound it, before the
first trial starts.
"""

from __future__ import annotations

from nsadiag.finding.numbers import duration
from nsadiag.spec import TrialSpec
from nsadiag.triage.decide import TRIAL_OVERHEAD_S

ANNOUNCE_S = 300.0
"""Worst cases at least this long are announced."""
CHECK_PASSES = {"causality": 2}
"""Children a check runs (causality runs again at a longer sequence)."""


def worst_case_s(trials: int, spec: TrialSpec, extra_s: float = 0.0) -> float:
    """``trials`` trials of ``spec``, each at its budget plus its overhead."""
    return trials * (spec.budget_s + TRIAL_OVERHEAD_S + extra_s)


def announce(command: str, trials: int, spec: TrialSpec, bounds: str,
             extra_s: float = 0.0, noun: str = "trial") -> str | None:
    """The sentence a command prints before it starts when its worst case is long, None
    otherwise; ``bounds`` names the options that shorten it."""
    worst = worst_case_s(trials, spec, extra_s)
    if worst < ANNOUNCE_S:
        return None
    verb = "bound" if " and " in bounds else "bounds"
    return (f"nsadiag {command}: {trials} {noun}{'' if trials == 1 else 's'} of up to "
            f"{spec.budget_s:g} s each: at worst {duration(worst)} (each ends at its "
            f"--budget; {bounds} {verb} it)")


def sweep_plan(command: str, points: int, spec: TrialSpec) -> str | None:
    what = "--seq-lens" if command == "sweep-seq" else "--layers"
    return announce(command, points, spec, f"--budget and {what}")


def check_plan(spec: TrialSpec, name: str) -> str | None:
    names = ["causality", "parity", "ckpt", "ddp"] if name == "all" else [name]
    passes = sum(CHECK_PASSES.get(n, 1) for n in names)
    return announce(f"check {name}", passes, spec, "--budget", noun="check run")


def triage_plan(max_minutes: float) -> str | None:
    """A triage is bounded by its own limit."""
    if max_minutes * 60.0 < ANNOUNCE_S:
        return None
    return (f"nsadiag triage: at worst {duration(max_minutes * 60.0)} (--max-minutes bounds "
            f"it; the report says what was reached)")
