"""Numbers as nsadiag prints them: counts, significant digits, shares, durations, bytes.

One module for every unit, so a figure reads the same wherever it is quoted. It imports
nothing from nsadiag: verdicts, findings, reports and the CLI all format through it.

Counts are exact and printed whole (``count``: 1,029). Timings and rates carry two
significant digits (``sig``), shares whole percents (``share``; below 1 % two significant
digits). Durations: in a sentence, in the unit a reader thinks in (``duration``: 40 s,
12 min, 2.1 h); an estimate rounded to whole units (``rounded_duration``: 40 s, 3 min,
2.5 h); a running clock (``clock``: 1:05); a table cell (``seconds_cell``: 0.25). Bytes:
in a sentence to two or three significant digits (``size``: 1.5 GiB); in a fixed unit with
a fixed format (``in_unit``, ``gib``, ``mib``: the memory figures of verdict reasons and
refusals); a table cell in the largest unit that fits (``bytes_cell``). A cell is "-" for
no value.
"""

from __future__ import annotations

import math

UNIT_BYTES = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
"""The binary units bytes are printed in."""


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


# ---- durations -------------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """40 s, 12 min, 2.1 h: two significant digits in the largest unit that fits."""
    if seconds >= 3600:
        return f"{sig(seconds / 3600)} h"
    if seconds >= 120:
        return f"{sig(seconds / 60)} min"
    return f"{sig(seconds)} s"


def rounded_duration(seconds: float) -> str:
    """"under a second", "40 s", "3 min", "2.5 h": an estimate, so whole seconds up to a
    minute and a half, whole minutes up to an hour and a half, then tenths of hours."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour on)."""
    whole = int(max(0.0, seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def seconds_cell(value: float | None) -> str:
    """Seconds with two decimals; "-" for no value."""
    return "-" if value is None or value != value else f"{value:.2f}"


# ---- bytes -----------------------------------------------------------------------------------


def size(value: float) -> str:
    """Bytes in KiB, MiB or GiB, two or three significant digits."""
    for unit in ("GiB", "MiB", "KiB"):
        scaled = value / UNIT_BYTES[unit]
        if scaled >= 1:
            return f"{sig(scaled, 3 if scaled < 100 else 2)} {unit}"
    return f"{int(value)} B"


def in_unit(value: float, unit: str, spec: str) -> str:
    """``value`` bytes in ``unit`` (KiB, MiB or GiB) with the format ``spec``:
    ``in_unit(3 * 2**29, "GiB", ".2f")`` is "1.50 GiB"."""
    return f"{value / UNIT_BYTES[unit]:{spec}} {unit}"


def gib(value: float, spec: str = ".2f") -> str:
    """``value`` bytes in GiB, by default to two decimals as verdict reasons quote a peak or a
    memory cap: 1.50 GiB."""
    return in_unit(value, "GiB", spec)


def mib(value: float, spec: str = ",.1f") -> str:
    """``value`` bytes in MiB, by default to a tenth with thousands separators as verdict
    reasons quote memory growth: 1,536.0 MiB."""
    return in_unit(value, "MiB", spec)


def bytes_cell(value: float | None) -> str:
    """Bytes in KiB, MiB or GiB, whichever is the largest the value reaches (KiB below a
    MiB); "-" for no value."""
    if value is None or value != value:
        return "-"
    if value >= UNIT_BYTES["GiB"]:
        return gib(value)
    return in_unit(value, "MiB", ".0f") if value >= UNIT_BYTES["MiB"] else \
        in_unit(value, "KiB", ".0f")
