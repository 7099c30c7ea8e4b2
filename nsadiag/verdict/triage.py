"""The verdicts a triage states beyond its trials' own: what a correctness check that ran
out of time stands for, and the triage's verdict when no failure stands."""

from __future__ import annotations

from nsadiag.verdict.names import TIMING, VerdictName

CHECK_TIMED_OUT = TIMING - {VerdictName.STALL_BUSY}
"""Final check verdicts that say the check ran out of time and decided nothing (SLOW: records
written before checks were fitted to their budget). A job's timing verdict (TIMING) means the
check was cut short by time: it is fitted to its budget and run again; but a STALL-BUSY at
the smallest size stays a failure (a check that small ends in seconds), so it is no final
"out of time"."""


def check_verdict(name: str) -> VerdictName:
    """The verdict a check's final verdict ``name`` stands for: INCONCLUSIVE when the check
    ran out of time (CHECK_TIMED_OUT: it decided nothing about any module), else ``name``."""
    verdict = VerdictName(name)
    return VerdictName.INCONCLUSIVE if verdict in CHECK_TIMED_OUT else verdict


def triage_verdict(unconfirmed: bool, slow_by_size: bool) -> VerdictName:
    """A triage's verdict when neither a trial nor a check failed: INCONCLUSIVE when the
    repeats did not confirm the sweep's timing verdict (``unconfirmed``), SLOW when some
    depths were slow by size (the work outlasts the budget, done without a defect: no
    failure), else OK."""
    if unconfirmed:
        return VerdictName.INCONCLUSIVE
    return VerdictName.SLOW if slow_by_size else VerdictName.OK
