"""The decisions of an automatic triage, as pure functions (no trials, no clock, no I/O).

A triage asks a trial function questions and this module decides which question comes next:

* ``find_threshold``  the layer count where the verdict changes: exponential growth
  1, 2, 4, ... up to the deepest allowed count, then binary search between the deepest
  passing count and the first failing one. Failure is assumed monotone in depth (a model
  that fails at n layers fails at n + 1); the search costs about 2·log2(max_depth) trials.
* ``ddmin``           delta debugging (Zeller and Hildebrandt, 2002): from a failing
  configuration, the smallest set of changes against a healthy baseline that still fails.
  The result is 1-minimal: undoing any one remaining change makes the failure go away.
* ``confidence`` and ``needs_repeat``  repeated trials of one configuration: the verdict
  most of them agree on, "k of n", and whether one more repeat is worth it.
* ``plan_trial_budget`` and ``TimeLimit``  turning a wall-clock limit for the whole triage
  into per-trial budgets, and the check before each trial that it can still finish.
* ``knob_changes`` and ``env_problems``  what differs from the baseline, and what in the
  environment would weaken the evidence.
* ``reproduces``  whether a bisection test shows the failure: a SLOW by its work (a defect
  counted, or time per step far above its expected cost), whatever its verdict.
* ``time_by_module``  where a trial's time went, from its heartbeat events.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from nsadiag.envinfo import EnvReport
from nsadiag.evidence import Evidence
from nsadiag.finding.numbers import cost_ratio
from nsadiag.verdict import VerdictName, is_failure
from nsadiag.verdict.thresholds import DEFECT_COST_RATIO, LOADED_PER_CPU


class MeasuredTest(Protocol):
    """What ``reproduces`` reads of a bisection test (nsadiag.triage.state.TrialRef, which
    imports this module's Confidence and ModuleTime: named here by shape, not imported)."""

    verdict: VerdictName
    slow_by: str | None
    defect: bool | None
    cost_ratio: float | None
    expected_step_s: float | None

T = TypeVar("T", bound=Hashable)

BASELINE_SEQ_LEN = 64
"""The baseline's sequence length: short enough to be fast on any target."""

BASELINE = {"grad_ckpt": False, "dtype": "float32", "backend": None, "branches": None,
            "seq_len": BASELINE_SEQ_LEN, "world_size": 1}
"""The healthy configuration bisection moves towards: no checkpointing, fp32, the target's
default backend, every branch, a short sequence, one process."""

PLANNED_TRIALS = 12
"""A triage's time limit is split as if this many trials will run (sweep, repeats, branch
isolation and bisection of a typical failure)."""

MIN_TRIAL_BUDGET_S = 20.0
"""The time limit never plans a trial budget below this (unless the user's own budget is
smaller): a trial's budget also pays for starting Python, importing torch and building the
model, seconds on a busy machine, and a budget spent before training starts decides
nothing."""

TRIAL_OVERHEAD_S = 10.0
"""Wall time a trial can take beyond its budget: stack samples after the budget kill (or
the stall capture window), the faulthandler dump and killing the process group."""


class TriageStop(Exception):
    """The triage cannot go on; the message says why, in one sentence."""


class OutOfTime(TriageStop):
    """The triage's time limit leaves no room for the next trial."""


# ---- threshold search ---------------------------------------------------------------------


@dataclass
class Threshold:
    """The outcome of a depth search.

    threshold   the smallest failing layer count, None when every probed count passed
    deepest_ok  the largest passing count below the threshold (or overall), None if none
    probed      the counts in the order they were tried, with whether each failed
    """

    threshold: int | None
    deepest_ok: int | None
    probed: list[tuple[int, bool]] = field(default_factory=list)


def bracket(probed: Mapping[int, bool]) -> tuple[int | None, int | None]:
    """(deepest passing count below the first failure, smallest failing count) from the
    results so far; with no failure, (deepest passing count, None)."""
    failing = [n for n, failed in probed.items() if failed]
    first_bad = min(failing) if failing else None
    passing = [n for n, failed in probed.items()
               if not failed and (first_bad is None or n < first_bad)]
    return (max(passing) if passing else None), first_bad


def find_threshold(fails: Callable[[int], bool], max_depth: int) -> Threshold:
    """Exponential then binary search for the smallest failing depth in [1, max_depth].

    ``fails(n)`` runs (or looks up) the trial at n layers; each count is asked at most once.
    Exceptions from ``fails`` (e.g. OutOfTime) propagate; ``bracket`` of what was probed
    says what is known at that point.
    """
    if max_depth < 1:
        raise ValueError(f"max_depth: must be a positive integer, got {max_depth!r}")
    probed: dict[int, bool] = {}
    order: list[tuple[int, bool]] = []

    def probe(n: int) -> bool:
        if n not in probed:
            probed[n] = bool(fails(n))
            order.append((n, probed[n]))
        return probed[n]

    n = 1
    while not probe(n) and n < max_depth:
        n = min(2 * n, max_depth)
    low, high = bracket(probed)
    if high is None:
        return Threshold(None, low, order)
    low = low or 0  # 0 stands for "no passing count"; it is never probed
    while high - low > 1:
        middle = (low + high) // 2
        if probe(middle):
            high = middle
        else:
            low = middle
    return Threshold(high, low or None, order)


# ---- delta debugging ----------------------------------------------------------------------


def _split(items: Sequence[T], parts: int) -> list[list[T]]:
    """``items`` in ``parts`` contiguous chunks of near-equal size (none empty)."""
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(list(items[start:end]))
        start = end
    return [chunk for chunk in chunks if chunk]


def ddmin(changes: Sequence[T], fails: Callable[[frozenset[T]], bool]) -> list[T]:
    """A 1-minimal subset of ``changes`` that still fails, in the order given.

    ``fails(subset)`` runs the baseline with ``subset`` applied; the full set is known to
    fail and is never asked. The empty set (the baseline itself) is asked first: when it
    fails too, the answer is [] — no change is needed to fail. Every subset is asked at
    most once.
    """
    asked: dict[frozenset[T], bool] = {frozenset(changes): True}

    def test(subset: Iterable[T]) -> bool:
        key = frozenset(subset)
        if key not in asked:
            asked[key] = bool(fails(key))
        return asked[key]

    if test(()):
        return []
    current, parts = list(changes), 2
    while len(current) >= 2:
        chunks = _split(current, min(parts, len(current)))
        reduced = next((chunk for chunk in chunks if test(chunk)), None)
        if reduced is not None:
            current, parts = reduced, 2
            continue
        complements = [[c for c in current if c not in chunk] for chunk in chunks]
        reduced = next((rest for rest in complements if len(chunks) > 2 and test(rest)), None)
        if reduced is not None:
            current, parts = reduced, max(parts - 1, 2)
            continue
        if parts >= len(current):
            break
        parts = min(len(current), 2 * parts)
    return current


# ---- repeats and confidence ---------------------------------------------------------------


@dataclass
class Confidence:
    """The verdict most repeats agree on: ``agreeing`` of ``total`` runs gave it."""

    verdict: VerdictName
    agreeing: int
    total: int
    verdicts: list[VerdictName]

    def __post_init__(self) -> None:
        self.verdict = VerdictName(self.verdict)
        self.verdicts = [VerdictName(v) for v in self.verdicts]

    @property
    def flaky(self) -> bool:
        return self.agreeing < self.total

    def text(self) -> str:
        return f"{self.agreeing} of {self.total}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "flaky": self.flaky}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Confidence:
        """A stored confidence (``flaky`` is derived, not read)."""
        return cls(data["verdict"], data["agreeing"], data["total"], list(data["verdicts"]))


def confidence(verdicts: Sequence[str]) -> Confidence:
    """The most frequent verdict of ``verdicts`` (a tie goes to the non-OK verdict seen
    first, since a failure that shows up at all is the finding), with its count."""
    if not verdicts:
        raise ValueError("verdicts: need at least one verdict")
    counts = Counter(verdicts)
    top = max(counts.values())
    tied = [v for v in dict.fromkeys(verdicts) if counts[v] == top]
    chosen = next((v for v in tied if v != "OK"), tied[0])
    return Confidence(chosen, top, len(verdicts), list(verdicts))


def reproduced(first: str, found: Confidence) -> bool:
    """Whether the repeats confirm the first run's failure: always for a verdict no load can
    produce (a crash, a deadlock, an error seen once is real); for a timing verdict, only
    when the verdict most runs agree on is a failure (INCONCLUSIVE is not one: is_failure's
    default)."""
    return not VerdictName(first).is_timing or is_failure(found.verdict)


def needs_repeat(verdicts: Sequence[str], max_runs: int = 3) -> bool:
    """One repeat confirms a verdict; when runs disagree (flaky), repeat up to max_runs."""
    if len(verdicts) >= max_runs:
        return False
    return len(verdicts) < 2 or len(set(verdicts)) > 1


def reproduces(failing: str, test: MeasuredTest) -> bool:
    """Whether a bisection test (its trial reference: ``verdict``, ``slow_by``, ``defect``,
    ``cost_ratio``) reproduces a failure whose verdict is ``failing``.

    A SLOW failure is slow by defect (a slow by size is never chased): a property of the
    work, not of how many steps fitted the budget. A test reproduces it when its own
    measurements show it, whatever its verdict: the counts of its first forward say
    defect (``defect``), or its median time per step is DEFECT_COST_RATIO times its
    expected cost or more (``cost_ratio``: the step time over the dense reference's time
    here for the step's FLOPs). A test that finished its steps in time can still carry
    the defect; one that ran out of budget slow by size does not. Without either
    measurement the verdict decides (SLOW, not by size). A ratio whose expected time is
    too short to time (nsadiag.finding.numbers.MIN_EXPECTED_STEP_S) is no measurement. Any
    other failure: the same verdict."""
    if failing != VerdictName.SLOW:
        return test.verdict == failing
    defect, ratio = test.defect, test.cost_ratio
    expected = test.expected_step_s
    if expected is not None and ratio is not None and cost_ratio(expected, ratio) is None:
        ratio = None  # a step too short to time: its ratio means nothing
    if defect is None and ratio is None:
        return test.verdict == VerdictName.SLOW and test.slow_by != "size"
    return bool(defect) or (ratio is not None and ratio >= DEFECT_COST_RATIO)


# ---- time limit ---------------------------------------------------------------------------


def plan_trial_budget(max_minutes: float, user_budget_s: float,
                      planned_trials: int = PLANNED_TRIALS) -> float:
    """Seconds per trial: the user's budget, lowered so that ``planned_trials`` trials
    (each with its overhead) fit in the time limit, but not below MIN_TRIAL_BUDGET_S
    unless the user's budget is smaller still."""
    share = max_minutes * 60.0 / planned_trials - TRIAL_OVERHEAD_S
    return min(user_budget_s, max(MIN_TRIAL_BUDGET_S, share))


@dataclass
class TimeLimit:
    """A deadline on a monotonic clock; ``trial_budget`` hands out per-trial budgets."""

    deadline: float
    planned_budget_s: float

    def remaining(self, now: float) -> float:
        return self.deadline - now

    def trial_budget(self, now: float, extra_overhead_s: float = 0.0) -> float:
        """The budget for a trial starting at ``now``: the planned one, or what is left when
        less (then a SLOW verdict says only that the time ran out); OutOfTime when less
        than min(planned, MIN_TRIAL_BUDGET_S) is left. ``extra_overhead_s`` is wall time
        the trial takes beyond TRIAL_OVERHEAD_S (several ranks to sample)."""
        overhead = TRIAL_OVERHEAD_S + extra_overhead_s
        room = self.remaining(now) - overhead
        floor = min(self.planned_budget_s, MIN_TRIAL_BUDGET_S)
        if room < floor:
            raise OutOfTime(f"{max(0.0, self.remaining(now)):.0f} s left, a trial needs at "
                            f"least {floor + overhead:.0f} s")
        return min(self.planned_budget_s, room)


# ---- configurations -----------------------------------------------------------------------


def knob_changes(failing: Mapping[str, Any], accepted: Iterable[str],
                 baseline: Mapping[str, Any] = BASELINE) -> dict[str, Any]:
    """Knobs whose failing value differs from the baseline, among those the target accepts
    (in BASELINE order); the baseline's sequence length never exceeds the failing one."""
    accepted = set(accepted)
    base = dict(baseline)
    if "seq_len" in failing:
        base["seq_len"] = min(base["seq_len"], failing["seq_len"])
    return {knob: failing[knob] for knob in base
            if knob in accepted and knob in failing and failing[knob] != base[knob]}


def baseline_values(failing: Mapping[str, Any], changes: Mapping[str, Any],
                    baseline: Mapping[str, Any] = BASELINE) -> dict[str, Any]:
    """The baseline value of every knob in ``changes`` (with the capped sequence length)."""
    values = {knob: baseline[knob] for knob in changes}
    if "seq_len" in values:
        values["seq_len"] = min(baseline["seq_len"], failing["seq_len"])
    return values


def env_problems(env: EnvReport, device: str) -> list[str]:
    """Sentences for what in the environment weakens a diagnosis."""
    problems = []
    if (env.py_spy or "").startswith(("not found", "unusable")):
        problems.append(f"py-spy {env.py_spy}: verdicts come without stack samples or hot "
                        f"frames")
    if (env.ptrace or "").startswith("refused"):
        problems.append(f"ptrace {env.ptrace}")
    if device == "cuda" and not env.devices:
        problems.append(f"device cuda requested but CUDA is {env.cuda}")
    threads, cpus = env.torch_threads, env.cpu_count
    if isinstance(threads, int) and isinstance(cpus, int) and cpus and threads > cpus:
        problems.append(f"torch uses {threads} threads on {cpus} CPUs: timings are "
                        f"oversubscribed")
    if (env.cuda or "").startswith("torch not installed"):
        problems.append("torch is not installed")
    load, usable = env.load_average, env.usable_cpus or cpus
    if load and isinstance(usable, int) and usable and load[0] > LOADED_PER_CPU * usable:
        problems.append(f"the machine is loaded: load average {load[0]:.1f} on {usable} "
                        f"usable CPU(s): timings stretch, and a timing verdict (SLOW, "
                        f"STALL-BUSY) may read INCONCLUSIVE or not reproduce")
    return problems


# ---- where the time goes ------------------------------------------------------------------


@dataclass
class ModuleTime:
    """Seconds between enter and exit events of one module (or branch) in one phase,
    summed over the trial; ``open`` counts intervals still running at ``end``."""

    module: str
    phase: str
    seconds: float
    open: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_by_module(events: Sequence[Mapping[str, Any]], end: float | None = None
                   ) -> list[ModuleTime]:
    """Summed enter->exit durations per (module, phase), longest first, of the innermost
    modules only (a block containing a branch that has its own events is left out: its
    time includes the branch's). Forward intervals inside a backward phase (checkpoint
    recompute) count as forward. An interval without an exit runs until ``end`` (the
    kill time) or the last event."""
    last_t = end if end is not None else (events[-1]["t"] if events else 0.0)
    opened: dict[tuple[str, str], list[float]] = {}
    totals: dict[tuple[str, str], ModuleTime] = {}
    for event in events:
        if event.get("kind") != "module":
            continue
        key = (event["module"], event["phase"])
        entry = totals.setdefault(key, ModuleTime(*key, 0.0))
        if event.get("edge") == "enter":
            opened.setdefault(key, []).append(event["t"])
        elif opened.get(key):
            entry.seconds += event["t"] - opened[key].pop()
    for key, starts in opened.items():
        for start in starts:
            totals[key].seconds += max(0.0, last_t - start)
            totals[key].open += 1
    names = {module for module, _ in totals}
    inner = [t for t in totals.values()
             if not any(other.startswith(t.module + ".") for other in names)]
    return sorted(inner, key=lambda t: t.seconds, reverse=True)


@dataclass
class TimeSpent:
    """Where a trial's time went: ``span_s`` (from the first training event kept to the
    later of the stop and the last event), ``events`` kept of ``events_total`` (the
    evidence keeps the most recent ones only, so the span can be the run's last part), the
    top entries ``by_pattern`` (layers summed) and ``by_module`` (time_by_module)."""

    span_s: float
    events: int
    events_total: int
    by_pattern: list[ModuleTime]
    by_module: list[ModuleTime]


def attribute_time(evidence: Evidence | None, top: int = 8) -> TimeSpent:
    """Where a trial's time went, from its evidence's heartbeat events (TimeSpent), the
    ``top`` entries of each list; nothing attributed for a record without evidence."""
    events = evidence.events if evidence is not None else []
    # the runner decides to stop before it samples the stacks, and the child goes on
    # meanwhile: its last events can come after the decision
    ended_at = evidence.outcome.ended_at if evidence is not None else None
    ends = [t for t in (ended_at, events[-1]["t"] if events else None) if t is not None]
    end = max(ends) if ends else None
    inner = time_by_module(events, end)
    training = [e["t"] for e in events if e.get("phase") != "build"]
    start = training[0] if training else (events[0]["t"] if events else 0.0)
    counts = evidence.event_counts if evidence is not None else {}
    total = sum(n for kind, n in counts.items() if kind != "pulse")
    return TimeSpent(span_s=(end if end is not None else start) - start, events=len(events),
                     events_total=max(total, len(events)),
                     by_pattern=by_layer_pattern(inner)[:top], by_module=inner[:top])


def share(part: float, whole: float) -> float | None:
    """part / whole, None when whole is not positive or not finite."""
    return part / whole if whole > 0 and math.isfinite(whole) else None


def by_layer_pattern(times: Sequence[ModuleTime]) -> list[ModuleTime]:
    """``time_by_module`` summed over layer indices: "blocks.3.attn.sel" counts towards
    "blocks.*.attn.sel"; longest first."""
    grouped: dict[tuple[str, str], ModuleTime] = {}
    for t in times:
        key = (re.sub(r"(?<=\.)\d+(?=\.|$)", "*", t.module), t.phase)
        entry = grouped.setdefault(key, ModuleTime(*key, 0.0))
        entry.seconds += t.seconds
        entry.open += t.open
    return sorted(grouped.values(), key=lambda t: t.seconds, reverse=True)
