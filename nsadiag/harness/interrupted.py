"""The verdict of a run the user interrupted: what was known when the stop came.

A run interrupted before the clock said stop has no verdict of its own: it is
INCONCLUSIVE, and its first reason says who stopped it, when, after how long, and how far
the training process had come. A run interrupted after the clock said stop (while its
processes were being sampled: a stall or the deadline was already decided) keeps the
verdict the rules give, and the interruption is added as its last reason. Either way the
facts say it (``facts["interrupted"]``), so that a report rendered later says it too.
"""

from __future__ import annotations

import time
from typing import Any

from nsadiag.harness import stop
from nsadiag.harness.session import SessionEnd
from nsadiag.harness.streams import Stream
from nsadiag.verdict.names import Verdict, VerdictName


def when(at: float) -> str:
    """A wall-clock time as a report prints it, in UTC."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def interruption(end: SessionEnd) -> dict[str, Any]:
    """The facts of the interruption: when, after how long, by which signal, and whether
    a verdict had been decided by then."""
    at = end.interrupted_at if end.interrupted_at is not None else end.ended_at
    return {"at": at, "after_s": round(max(0.0, at - end.started), 1),
            "signal": stop.signal_name(), "by": stop.cause(),
            "decided": end.due is not None}


def _progress(main: Stream | None) -> str:
    if main is None:
        return "no process of the command had started its heartbeat"
    steps = main.counts.get("step", 0)
    events = sum(n for kind, n in main.counts.items() if kind != "pulse")
    return (f"the training process ({main.name}) had finished {steps} step"
            f"{'' if steps == 1 else 's'} and written {events} heartbeat event"
            f"{'' if events == 1 else 's'}")


def interrupted_verdict(verdict: Verdict, end: SessionEnd, main: Stream | None) -> Verdict:
    """``verdict`` (what the rules said) as it stands for an interrupted session."""
    facts = interruption(end)
    said = f"interrupted by {facts['by']} at {when(facts['at'])} (after {facts['after_s']} s)"
    if facts["decided"]:
        reasons = [*verdict.reasons,
                   f"{said}, {facts['at'] - end.ended_at:.1f} s after this verdict was "
                   f"decided, while the processes were being sampled"]
        return Verdict(verdict.name, reasons, {**verdict.facts.to_dict(), "interrupted": facts})
    return Verdict(VerdictName.INCONCLUSIVE,
                   [f"{said}, before a verdict: {_progress(main)}"], {"interrupted": facts})
