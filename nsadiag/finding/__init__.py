"""What a run found, typed: one ``Finding`` for every run kind, decided before any report.

A finding answers what a reader asks first, in this order:

    verdict       OK, SLOW, STALL-BUSY, STALL-COLLECTIVE, DEADLOCK, OOM, ERROR, CRASH, WRONG,
                  INCONCLUSIVE, or MEASURED for a measurement without a verdict
    kind          what sort of trouble (``KINDS``): slow by size, slow by defect, stuck,
                  wrong, crashed; healthy, inconclusive or measured otherwise
    culprit       the one user line responsible (``Culprit``: FILE:LINE, the code, why that
                  line), the defect's line rather than the hottest healthy one; None when
                  nothing failed or the evidence names no line
    proof         the one number that proves it, as a sentence
    next_action   one concrete sentence: the fix, or the next command

then a summary (sentences, ``SUMMARY_WORDS`` words at most), one-line results marked
ok/fail/warn (``Item``), what is ruled out and what is implicated, and recommendations.
Each command builds its finding where its result is assembled (``nsadiag.finding.trial``
for one trial, ``.sweep``, ``.ddp``, ``.check``, ``.attach``, ``.measured``, and
``nsadiag.triage.finding``); ``nsadiag.report`` only lays it out. summary.json carries it
as ``finding`` (``to_dict``), and ``from_dict`` reads it back.

Decided once and kept: `nsadiag run` and ``nsadiag.watch()`` keep their finding with
their record in record.json (``.run.with_finding``), `nsadiag check`, `memory`, `trace`,
`attach` and `stacks` in checks.json, memory.json, trace-result.json, attach.json and
stacks.json; the sweeps
(sweep-layers, isolate-branch, sweep-seq: ``.sweep.keep_sweep_finding``), `nsadiag ddp`
(``.ddp``) and `nsadiag triage` (``nsadiag.triage.finding.keep_triage_finding``) in the
run directory's finding.json, decided as the command ends (a sweep or triage that resumes
decides again from all its trials). A report renders the kept one; it decides one only
for a file written before findings were kept (nsadiag.report.dispatch.decided_late).
Every command keeps its finding.
The data types (``Finding``, ``Culprit``, ``Item`` and the words their fields take) live
in nsadiag.findingdata, below the run directory that stores them, and are handed on
here; this package holds the deciding code.
"""

from __future__ import annotations

from nsadiag.findingdata import (
    KINDS,
    MARKS,
    STATUSES,
    SUMMARY_WORDS,
    Culprit,
    Finding,
    Item,
    fail,
    fit_words,
    ok,
    warn,
    words,
)

__all__ = ["CRASHED", "KINDS", "MARKS", "STATUSES", "STUCK", "SUMMARY_WORDS", "Culprit",
           "Finding", "Item", "fail", "fit_words", "kind_of", "ok", "warn", "words"]

STUCK = frozenset({"STALL-BUSY", "STALL-COLLECTIVE", "DEADLOCK"})
CRASHED = frozenset({"OOM", "ERROR", "CRASH"})


def kind_of(verdict: str, slow_by: str | None = None) -> str:
    """The kind of a verdict: SLOW by its ``slow_by`` fact ("size", "defect", or None when
    the work was not counted), stalls and deadlocks stuck, OOM/ERROR/CRASH crashed, WRONG
    wrong, OK healthy, INCONCLUSIVE inconclusive, MEASURED measured."""
    if verdict == "SLOW":
        return {"defect": "slow by defect", "size": "slow by size"}.get(
            slow_by or "", "slow, work not counted")
    if verdict in STUCK:
        return "stuck"
    if verdict in CRASHED:
        return "crashed"
    return {"WRONG": "wrong", "OK": "healthy", "INCONCLUSIVE": "inconclusive",
            "MEASURED": "measured"}.get(verdict, "inconclusive")
