"""A straggler in a finding's top block: a job that ended well (or was only slow) but
waited for one rank at every step has something to fix, and its top block and next step say
which rank, how much slower, and where its sampler saw it (the straggler itself is decided in
nsadiag.verdict.straggler; the report's Straggler section formats it)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from nsadiag.finding import Culprit, Finding
from nsadiag.verdict.straggler import Straggler

NAMED_IN_TOP = ("OK", "SLOW")
"""The verdicts whose top block names a straggler: a stuck or failed run has its own
culprit, and the straggler stays in its Straggler section."""


def with_straggler(finding: Finding, found: dict[str, Any] | None) -> Finding:
    """``finding`` with the straggler ``found`` (a record's ``straggler`` fact) in its top
    block: its headline names it, its proof gives its own time per step against the others'
    median, its line is the frame its sampler saw most (where the finding names no line of
    its own), and its next step is the straggler's; a SLOW's own next step follows as a
    recommendation. Unchanged for another verdict or without a straggler."""
    if finding.verdict not in NAMED_IN_TOP or not isinstance(found, dict):
        return finding
    slow = Straggler.from_dict(found)
    at = slow.frame_at()
    culprit = finding.culprit
    if culprit is None and at is not None:
        file, line = at[0].rsplit(":", 1)
        frame = slow.frame or {}
        culprit = Culprit(file, int(line), f"{slow.label} was here in {frame['seen']} of its "
                          f"last {frame['of']} sampler pulses, the straggler's most seen "
                          f"frame (in {at[1]})")
    kept = [] if finding.next_action.startswith("Nothing") else [finding.next_action]
    seen = found.get("seen_at")  # the figures are those of the latest read that named it
    when = (" (last seen at " + time.strftime("%H:%M:%S", time.gmtime(float(seen))) +
            " UTC)" if isinstance(seen, (int, float)) else "")
    return dataclasses.replace(
        finding, headline=f"{finding.headline}; straggler: {slow.label}, {slow.times()}",
        proof=slow.proof() + when, culprit=culprit, next_action=next_step(slow),
        recommendations=[*kept, *finding.recommendations])


def next_step(slow: Straggler) -> str:
    """What to do about a straggler: look where its sampler saw it most, or (its host did
    not say) at the part of its step that takes longest."""
    at = slow.frame_at()
    if at is not None:
        frame = slow.frame or {}
        where = (f"at {at[0]} (in {at[1]}; its sampler saw it there in {frame['seen']} "
                 f"of its last {frame['of']} pulses): look there")
    else:
        before = slow.forward_s >= slow.backward_s
        part = ("before its backward (loading the batch and forward)" if before
                else "in its backward")
        where = (f"with {max(slow.forward_s, slow.backward_s):.3f} s of its "
                 f"{slow.step_s:.3f} s step {part}: look there (its host's sampler "
                 f"named no frame)")
    return (f"{slow.label[:1].upper()}{slow.label[1:]} spends {slow.own_s:.3f} s per "
            f"step outside collectives, {slow.times()} the others' median "
            f"({slow.others_own_s:.3f} s), {where}; the other {slow.others} "
            f"rank(s) wait for it in collectives (a median {slow.others_waited_s:.3f} s "
            f"per step).")
