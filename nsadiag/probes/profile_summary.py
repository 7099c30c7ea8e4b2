"""The parts of a profile summary (nsadiag.probes.profile.summarize, stored as the
evidence's ``profile``) that findings read line by line, typed: the hottest lines of the
user's code, the loop counters that advanced, the frames by inclusive count.

``ProfileSummary.from_dict`` parses the stored summary once; keys a summary written by an
older nsadiag lacks read as None (or as no rows), so such a record still yields what it
holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HotLine:
    """A line of the user's code that the samples were in: ``where`` ("forward
    (model.py:42)"), its file and line, its source when it could be read, the share of
    all samples, and the phase ("forward", "backward", ...) it was seen in most."""

    where: str
    file: str | None
    line: int | None
    code: str | None
    fraction: float
    phase: str | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HotLine:
        return cls(where=str(data["where"]), file=data.get("file"), line=data.get("line"),
                   code=data.get("code"), fraction=float(data.get("fraction") or 0.0),
                   phase=data.get("phase"))


@dataclass(frozen=True)
class CountedLoop:
    """A loop counter that rose between samples: where it was read ("forward
    (model.py:57)"), the variable, how far it advanced and at what pace (None: no time
    between readings), whether the source steps it by one (None: unknown), and the line of
    its ``for`` header (None: not found)."""

    where: str
    variable: str
    advanced: int
    rate_per_s: float | None
    by_one: bool | None
    for_line: int | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CountedLoop:
        return cls(where=str(data["where"]), variable=str(data["variable"]),
                   advanced=int(data.get("advanced") or 0), rate_per_s=data.get("rate_per_s"),
                   by_one=data.get("by_one"), for_line=data.get("for_line"))


@dataclass(frozen=True)
class ProfiledFrame:
    """A frame the samples passed through: ``where``, its function and file."""

    where: str
    function: str | None
    file: str | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProfiledFrame:
        return cls(where=str(data.get("where") or ""), function=data.get("function"),
                   file=data.get("file"))


@dataclass(frozen=True)
class ProfileSummary:
    """The hot lines, counted loops and frames of a profile summary, in its order."""

    hot_lines: tuple[HotLine, ...] = ()
    loops: tuple[CountedLoop, ...] = ()
    frames: tuple[ProfiledFrame, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ProfileSummary:
        """The summary's rows; none for a record without a profile (None or {})."""
        data = data or {}
        return cls(hot_lines=tuple(HotLine.from_dict(row) for row in data.get("hot_lines") or ()),
                   loops=tuple(CountedLoop.from_dict(row) for row in data.get("loops") or ()),
                   frames=tuple(ProfiledFrame.from_dict(row) for row in data.get("frames") or ()))
