"""Numbers as a finding quotes them: rounded to what the measurement supports.

Counts are exact and printed whole (``count``: 1,029). Timings and rates carry two
significant digits (``sig``), shares whole percents (``share``; below 1 % two significant
digits), durations in the unit a reader thinks in (``duration``: 40 s, 12 min, 2.1 h).
A step's time against its expected cost (nsadiag.probes.efficiency.step_cost) means
something only when the expected time is long enough to be more than a step's fixed
overhead: ``cost_ratio`` is None below MIN_EXPECTED_STEP_S.
"""

from __future__ import annotations

import math

from nsadiag.verdict.thresholds import MIN_EXPECTED_STEP_S


def count(value: int | float) -> str:
    """A count, whole, with thousands separators."""
    return f"{int(round(value)):,}"


def sig(value: float, digits: int = 2) -> str:
    """``value`` to ``digits`` significant digits, without an exponent for ordinary sizes
    (0.00042, 3.5, 1,200)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    magnitude = math.floor(math.log10(abs(value)))
    rounded = round(value, digits - 1 - magnitude)
    if abs(rounded) >= 10 ** (digits - 1):
        return f"{int(rounded):,}"
    return f"{rounded:.{max(0, digits - 1 - magnitude)}f}"


def si(value: float, unit: str = "") -> str:
    """``value`` with an SI prefix and two significant digits: 7.6 kFLOP, 1.5 MFLOP."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{sig(value / factor)} {prefix}{unit}"
    return f"{sig(value)} {unit}".rstrip()


def share(fraction: float) -> str:
    """A fraction as a percentage: whole percents, two significant digits below 1 %."""
    percent = 100 * fraction
    if 0 < abs(percent) < 1:
        return f"{sig(percent)}%"
    return f"{percent:.0f}%"


def duration(seconds: float) -> str:
    """40 s, 12 min, 2.1 h: two significant digits in the largest unit that fits."""
    if seconds >= 3600:
        return f"{sig(seconds / 3600)} h"
    if seconds >= 120:
        return f"{sig(seconds / 60)} min"
    return f"{sig(seconds)} s"


def size(value: float) -> str:
    """Bytes in KiB, MiB or GiB, two or three significant digits."""
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= factor:
            return f"{sig(value / factor, 3 if value / factor < 100 else 2)} {unit}"
    return f"{int(value)} B"


def cost_ratio(expected_s: float | None, ratio: float | None) -> float | None:
    """The step time over its expected cost, None when unknown or when the expected time
    is under MIN_EXPECTED_STEP_S (too short to mean anything)."""
    if expected_s is None or ratio is None or expected_s < MIN_EXPECTED_STEP_S:
        return None
    return ratio
