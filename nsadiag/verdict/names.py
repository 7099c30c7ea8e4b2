"""The verdicts: their names, which of them are failures, and the Verdict a rule returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

NAMES = ("OK", "SLOW", "INCONCLUSIVE", "STALL-COLLECTIVE", "STALL-BUSY", "DEADLOCK", "OOM",
         "ERROR", "CRASH", "WRONG")
"""Every verdict. WRONG comes from nsadiag.checks, never from a trial's evidence. INCONCLUSIVE
is a timing verdict (SLOW, STALL-BUSY) that did not reproduce or that machine contention
explains; it is never a failure."""

FAILURES = frozenset(NAMES) - {"OK", "INCONCLUSIVE"}
"""Verdicts that are a failure found (exit code 1), but for a SLOW by size (is_failure)."""


def is_failure(name: str, slow_by: str | None = None) -> bool:
    """Whether a verdict is a failure found: a name in FAILURES, except a SLOW by size (the
    work itself outlasts the time limit, done without a defect: big, not broken).
    ``slow_by`` is the verdict's fact of that name ("size", "defect" or None)."""
    return name in FAILURES and not (name == "SLOW" and slow_by == "size")


@dataclass
class Verdict:
    """``name`` is one of NAMES; ``reasons`` are sentences quoting measured facts;
    ``facts`` holds the numbers and names behind them (rate, eta_s, hot_frame, ...)."""

    name: str
    reasons: list[str]
    facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ValueError(f"Verdict.name: {self.name!r} is not one of {', '.join(NAMES)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
