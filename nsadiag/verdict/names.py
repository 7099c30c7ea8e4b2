"""The verdicts: their names, which of them are failures, which are timing verdicts, and the
Verdict a rule returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from nsadiag.verdictfacts import VerdictFacts


class VerdictName(str, Enum):
    """Every verdict. WRONG comes from nsadiag.checks, never from a trial's evidence.
    INCONCLUSIVE is a timing verdict (SLOW, STALL-BUSY) that did not reproduce or that
    machine contention explains; it is never a failure found.

    A ``str``: a member equals its name (``VerdictName.OK == "OK"``), formats and serializes
    as it (JSON, f-strings and report text are unchanged) and hashes as it, so a member and
    the plain string read from a record find each other in sets and dict keys."""

    OK = "OK"
    SLOW = "SLOW"
    INCONCLUSIVE = "INCONCLUSIVE"
    STALL_COLLECTIVE = "STALL-COLLECTIVE"
    STALL_BUSY = "STALL-BUSY"
    DEADLOCK = "DEADLOCK"
    OOM = "OOM"
    ERROR = "ERROR"
    CRASH = "CRASH"
    WRONG = "WRONG"

    # the str behaviour, not Enum's "VerdictName.OK" and hash of the member's Python name
    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__

    @property
    def is_timing(self) -> bool:
        """A verdict a loaded machine can produce on a healthy run (TIMING)."""
        return self in TIMING


NAMES = tuple(name.value for name in VerdictName)
"""Every verdict's name, in VerdictName's order."""

FAILURES = frozenset(VerdictName) - {VerdictName.OK, VerdictName.INCONCLUSIVE}
"""Verdicts that are a failure found (exit code 1), but for a SLOW by size (is_failure)."""

TIMING = frozenset({VerdictName.SLOW, VerdictName.STALL_BUSY, VerdictName.INCONCLUSIVE})
"""Verdicts that measure time against a limit, so contention or a budget too small for the
work can produce them on a healthy run: a triage counts one only when its repeats confirm a
failure, a check cut short by one is fitted to its budget and run again."""


def is_failure(name: str, slow_by: str | None = None, *,
               inconclusive_fails: bool = False) -> bool:
    """Whether a verdict is a failure found: a name in FAILURES, except a SLOW by size (the
    work itself outlasts the time limit, done without a defect: big, not broken).
    ``slow_by`` is the verdict's fact of that name ("size", "defect" or None).

    INCONCLUSIVE is not a failure by default (exit codes, sweeps, reports: it decided
    nothing). ``inconclusive_fails=True`` counts it as one: a triage's depth search chases
    any trial that is not OK and not slow by size, and its repeats then decide whether an
    INCONCLUSIVE reproduces (nsadiag.triage.engine)."""
    if name == VerdictName.SLOW and slow_by == "size":
        return False
    return name in FAILURES or (inconclusive_fails and name == VerdictName.INCONCLUSIVE)


@dataclass
class Verdict:
    """``name`` is a VerdictName (a plain string of NAMES is parsed into one); ``reasons``
    are sentences quoting measured facts; ``facts`` holds the numbers and names behind them
    (rate, eta_s, hot_frame, ...), typed (nsadiag.verdictfacts): a rule's dict of them is
    parsed once, here, and a key no family has is an error (FactsError)."""

    name: VerdictName
    reasons: list[str]
    facts: VerdictFacts = field(default_factory=VerdictFacts)

    def __post_init__(self) -> None:
        try:
            self.name = VerdictName(self.name)
        except ValueError:
            raise ValueError(f"Verdict.name: {self.name!r} is not one of "
                             f"{', '.join(NAMES)}") from None
        if isinstance(self.facts, Mapping):
            self.facts = VerdictFacts.of(self.facts)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reasons": list(self.reasons),
                "facts": self.facts.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """A stored verdict: its facts parsed once (nsadiag.verdictfacts.from_dict: a value
        of the wrong type is a FactsError, a key no family has is left out); ValueError for
        a name that is not a verdict's."""
        return cls(data["name"], list(data["reasons"]),
                   VerdictFacts.from_dict(data.get("facts") or {}))
