"""A straggler: one rank of a job that still progresses taking longer than the others at
every one of its latest steps (pure: no I/O, no clock).

In synchronous data parallel training every rank's step lasts as long as the slowest
one's: the others wait for it in the step's collectives. So a rank's wall step time does
not single out a straggler; its own time does, the step's time outside collectives
(``StepPace.own_s``). A straggler's own time stands out while the others' time goes into
waiting in collectives for it. Own times are durations on each rank's own clock, so the
hosts' clocks need not agree.

``step_paces(events)`` reads a rank's finished steps from its heartbeat events (the "step"
events and its collectives' start and end), ``hot_frame(pulses)`` the user frame its
progress sampler saw most in its latest pulses; ``find_straggler(paces, ...)`` decides from
every rank's paces (what each host published in the job's store): a straggler is a rank
whose own time at every one of its latest STRAGGLER_STEPS finished steps (step 0, which
pays one-off costs, left out) is at least STRAGGLER_RATIO times, and STRAGGLER_MIN_GAP_S
more than, the median of the other ranks' own times (each rank's median over its latest
steps), while no other rank's is. A machine that is busy for every rank slows every rank
alike: no rank stands out. Each rank's latest steps are its own: hosts publish every few
seconds, so the ranks of another host may be some steps behind in what was read of them,
and the decision does not need the same steps of every rank.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nsadiag.verdict.thresholds import (
    STRAGGLER_KEEP_GAP_S,
    STRAGGLER_KEEP_RATIO,
    STRAGGLER_MIN_GAP_S,
    STRAGGLER_RATIO,
    STRAGGLER_STEPS,
)


@dataclass(frozen=True)
class StepPace:
    """One finished step of one rank: its index, when it ended (the rank's clock), how
    long it took, how much of that the rank spent inside collectives (issued and not yet
    completed), and how long it took before its backward began (loading the batch and
    forward) and in backward."""

    step: int
    t: float
    step_s: float
    waited_s: float
    forward_s: float
    backward_s: float

    @property
    def own_s(self) -> float:
        """The step's time outside collectives."""
        return max(self.step_s - self.waited_s, 0.0)

    def to_list(self) -> list[float]:
        """The compact form published in the store."""
        return [self.step, round(self.t, 3), round(self.step_s, 4), round(self.waited_s, 4),
                round(self.forward_s, 4), round(self.backward_s, 4)]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> StepPace:
        step, t, step_s, waited_s, forward_s, backward_s = row
        return cls(int(step), float(t), float(step_s), float(waited_s), float(forward_s),
                   float(backward_s))


def _covered(spans: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by the union of ``spans``."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in spans if b > start and a < end)
    total, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def step_paces(events: Sequence[dict[str, Any]]) -> list[StepPace]:
    """The finished steps of a rank whose events (oldest first) hold the whole step: a
    step that began before the first event kept is left out, since its collectives may
    have been dropped."""
    times = [float(e["t"]) for e in events if isinstance(e.get("t"), (int, float))]
    if not times:
        return []
    first = min(times)
    opened: dict[Any, float] = {}
    spans: list[tuple[float, float]] = []
    for event in events:
        if event.get("kind") != "collective" or not isinstance(event.get("t"), (int, float)):
            continue
        if event.get("edge") == "start":
            opened[event.get("n")] = float(event["t"])
        elif event.get("edge") == "end" and event.get("n") in opened:
            spans.append((opened.pop(event.get("n")), float(event["t"])))
    paces = []
    for event in events:
        if event.get("kind") != "step" or not isinstance(event.get("step_s"), (int, float)):
            continue
        end, step_s = float(event["t"]), float(event["step_s"])
        if end - step_s < first:
            continue
        paces.append(StepPace(int(event.get("step", -1)), end, step_s,
                              _covered(spans, end - step_s, end),
                              float(event.get("forward_s") or 0.0),
                              float(event.get("backward_s") or 0.0)))
    return paces


FRAME = re.compile(r"^(?P<function>\S+) \((?P<file>[^()]+):(?P<line>\d+)\)$")
"""A hot frame as the progress sampler names it: "main (train.py:31)"."""
HOT_FRAME_PULSES = 10
"""A rank's latest pulses (one a second) whose frames say where its time goes now."""


def hot_frame(pulses: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost user frame the sampler saw most in the latest HOT_FRAME_PULSES
    pulses that name one ({"frame", "seen", "of"}), None when none names one."""
    frames = [str(p["frame"]) for p in pulses if p.get("frame")][-HOT_FRAME_PULSES:]
    if not frames:
        return None
    top = max(set(frames), key=lambda f: (frames.count(f), f))
    return {"frame": top, "seen": frames.count(top), "of": len(frames)}


@dataclass(frozen=True)
class Straggler:
    """The slow rank (``rank``, and ``label``: its host, global and local rank in words)
    over its latest ``steps``: its median and least own time, the median of the other
    ranks' own times (each over its latest steps), its wall step time, the others' time
    waiting in collectives, and its time before and in backward (medians); ``frame``: where
    its host's sampler saw it most (hot_frame), None when its host did not say."""

    rank: int
    label: str
    host: str | None
    local_rank: int | None
    steps: tuple[int, ...]
    others: int
    own_s: float
    least_s: float
    others_own_s: float
    step_s: float
    others_waited_s: float
    forward_s: float
    backward_s: float
    frame: dict[str, Any] | None = None
    node_rank: int | None = None

    @property
    def ratio(self) -> float:
        return self.own_s / self.others_own_s if self.others_own_s > 0 else float("inf")

    def sentence(self) -> str:
        """The finding in words, every figure from the published paces."""
        first, last = self.steps[0], self.steps[-1]
        times = self.times()
        where = f" ({self.host}'s figures)" if self.host else ""
        rest = max(self.step_s - self.forward_s - self.backward_s, 0.0)
        return (f"straggler: {self.label} takes {self.own_s:.3f} s per step outside "
                f"collectives (at least {self.least_s:.3f} s at each of its steps "
                f"{first}-{last}) against a median of {self.others_own_s:.3f} s for the other "
                f"{self.others} rank(s) ({times}); the others wait a median "
                f"{self.others_waited_s:.3f} s per step in collectives. Where "
                f"its {self.step_s:.3f} s steps go{where}: {self.forward_s:.3f} s before its "
                f"backward (loading the batch and forward), {self.backward_s:.3f} s in "
                f"backward, {rest:.3f} s after (the optimizer and the rest)"
                + (f"; its sampler saw it at {self.frame['frame']} in {self.frame['seen']} of "
                   f"its last {self.frame['of']} pulses" if self.frame else ""))

    def times(self) -> str:
        """Its own time per step against the others', "2.9x" ("x" when theirs is nil)."""
        return "x" if self.ratio == float("inf") else f"{self.ratio:.1f}x"

    def frame_at(self) -> tuple[str, str] | None:
        """(FILE:LINE, function) of its hot frame, None when its host did not say."""
        found = FRAME.match(str((self.frame or {}).get("frame") or ""))
        return (f"{found['file']}:{found['line']}", found["function"]) if found else None

    def proof(self) -> str:
        """Its own time per step against the others', as the top block's proof."""
        return (f"{self.label} spends {self.own_s:.3f} s per step outside collectives "
                f"(at least {self.least_s:.3f} s at each of its steps {self.steps[0]}-"
                f"{self.steps[-1]}) against a median of {self.others_own_s:.3f} s for the "
                f"other {self.others} rank(s): {self.times()}")

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "label": self.label, "host": self.host,
                "local_rank": self.local_rank, "node_rank": self.node_rank,
                "steps": list(self.steps),
                "others": self.others, "own_s": self.own_s, "least_s": self.least_s,
                "others_own_s": self.others_own_s,
                "ratio": None if self.others_own_s <= 0 else round(self.ratio, 3),
                "step_s": self.step_s, "others_waited_s": self.others_waited_s,
                "forward_s": self.forward_s, "backward_s": self.backward_s,
                "frame": self.frame, "sentence": self.sentence()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Straggler:
        """A straggler as a record holds it (to_dict; a record older than ``node_rank``
        has none)."""
        return cls(int(data["rank"]), str(data["label"]), data.get("host"),
                   data.get("local_rank"), tuple(int(s) for s in data["steps"]),
                   int(data["others"]), float(data["own_s"]), float(data["least_s"]),
                   float(data["others_own_s"]), float(data["step_s"]),
                   float(data["others_waited_s"]), float(data["forward_s"]),
                   float(data["backward_s"]), data.get("frame"), data.get("node_rank"))


def find_straggler(paces: Mapping[int, Sequence[StepPace]],
                   names: Mapping[int, dict[str, Any]], labels: Mapping[int, str],
                   frames: Mapping[int, dict[str, Any] | None] | None = None,
                   named: int | None = None) -> Straggler | None:
    """The straggler among the ranks of ``paces`` ({global rank: its finished steps}), or
    None (see the module docstring); ``names`` and ``labels`` name each rank
    (nsadiag.ranknames: host, local rank; the label in words), ``frames`` give each rank's
    hot frame where its host knows it. ``named``: the rank named at the previous look, if
    any. A rank near the bar would come and go between looks; once named, it is kept while
    its least own time stays at STRAGGLER_KEEP_RATIO times, and STRAGGLER_KEEP_GAP_S more
    than, the others' median (and no other rank is slow): it is dropped only when it falls
    clearly below the bar."""
    windows = {r: [p for p in rows if p.step != 0][-STRAGGLER_STEPS:]
               for r, rows in paces.items() if rows}
    if len(windows) < 2 or any(len(w) < STRAGGLER_STEPS for w in windows.values()):
        return None
    typical = {r: statistics.median(p.own_s for p in w) for r, w in windows.items()}
    least = {r: min(p.own_s for p in w) for r, w in windows.items()}

    def stands_out(slow: int, ratio: float, gap_s: float) -> Straggler | None:
        others = sorted(r for r in windows if r != slow)
        rest = statistics.median(typical[r] for r in others)
        if least[slow] < ratio * rest or least[slow] - rest < gap_s:
            return None
        if any(typical[r] >= STRAGGLER_RATIO * rest and
               typical[r] - rest >= STRAGGLER_MIN_GAP_S for r in others):
            return None  # two or more slow ranks: not one straggler
        # (a rank a few milliseconds over a tiny median is no second straggler: the gap
        # holds the others to the bar the straggler met)
        mine = windows[slow]
        names_of = names.get(slow) or {}
        return Straggler(
            rank=slow, label=labels.get(slow, f"rank {slow}"), host=names_of.get("host"),
            local_rank=names_of.get("local_rank"), steps=tuple(p.step for p in mine),
            others=len(others), own_s=typical[slow], least_s=least[slow], others_own_s=rest,
            step_s=statistics.median(p.step_s for p in mine),
            others_waited_s=statistics.median(
                statistics.median(p.waited_s for p in windows[r]) for r in others),
            forward_s=statistics.median(p.forward_s for p in mine),
            backward_s=statistics.median(p.backward_s for p in mine),
            frame=(frames or {}).get(slow), node_rank=names_of.get("node_rank"))

    kept = stands_out(named, STRAGGLER_KEEP_RATIO, STRAGGLER_KEEP_GAP_S) \
        if named in windows else None
    return kept or stands_out(max(windows, key=lambda r: least[r]), STRAGGLER_RATIO,
                              STRAGGLER_MIN_GAP_S)
