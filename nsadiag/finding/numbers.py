"""Numbers as a finding quotes them: rounded to what the measurement supports.

The formatters (``count``, ``sig``, ``si``, ``share``, ``duration``, ``size``) are
nsadiag.fmt's, named here too for the findings that import them from this module.
A step's time against its expected cost (nsadiag.probes.efficiency.step_cost) means
something only when the expected time is long enough to be more than a step's fixed
overhead: ``cost_ratio`` is None below MIN_EXPECTED_STEP_S.
"""

from __future__ import annotations

from nsadiag.fmt import count, duration, share, si, sig, size
from nsadiag.verdict.thresholds import MIN_EXPECTED_STEP_S

__all__ = ["cost_ratio", "count", "duration", "share", "si", "sig", "size"]


def cost_ratio(expected_s: float | None, ratio: float | None) -> float | None:
    """The step time over its expected cost, None when unknown or when the expected time
    is under MIN_EXPECTED_STEP_S (too short to mean anything)."""
    if expected_s is None or ratio is None or expected_s < MIN_EXPECTED_STEP_S:
        return None
    return ratio
