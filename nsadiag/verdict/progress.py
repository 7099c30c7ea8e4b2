"""What progress is, how far a run got and how fast it moves, from its heartbeat events (pure).

``is_progress(event)`` is the one definition of progress, which the watcher's stall clock
(nsadiag.harness.streams), the verdict rules (nsadiag.verdict.rules) and an attach window
(nsadiag.verdict.window) all read. ``progress`` turns the last heartbeat events of a run
into a rate (module events per second over a recent window), the fraction done and an ETA.
Events are the heartbeat format of ``nsadiag.harness.heartbeat``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nsadiag.verdict.thresholds import MIN_RATE_SPAN_S, RATE_WINDOW_S, SILENCE_INTERVALS

PROGRESS_KINDS = frozenset({"start", "module", "step", "end", "collective"})
"""The heartbeat events that are progress by their kind: a phase started, a watched block
entered or left, a step finished, the run ended, a collective started or finished."""


def is_progress(event: Mapping[str, Any]) -> bool:
    """Whether one heartbeat event is progress: an event of a kind in PROGRESS_KINDS, or a
    pulse of the progress sampler (kind "pulse", nsadiag.probes.sampler) that saw progress
    (its "progress" field true: a loop iterating inside one module, autograd nodes running
    in backward). A pulse that saw none, and an event of any other kind, are not: a process
    writes them while it waits forever."""
    kind = event.get("kind")
    if kind == "pulse":
        return bool(event.get("progress"))
    return kind in PROGRESS_KINDS


@dataclass
class Progress:
    """How far a run got and how fast it moves.

    ``rate`` is module events per second over the last ``window_s`` seconds of heartbeats
    (None with fewer than two, or over less than MIN_RATE_SPAN_S); ``fraction`` the part
    of the run done, from module events when a step's event count is known, else from
    steps plus the position inside the current step (``basis`` says which); ``eta_s`` the
    seconds left at that pace.
    """

    rate: float | None
    window_s: float
    events_done: int
    events_expected: int | None
    fraction: float | None
    eta_s: float | None
    basis: str



def module_events(events: Sequence[dict]) -> list[dict]:
    return [event for event in events if event.get("kind") == "module"]


def _rate(module_events: Sequence[dict], window_s: float, until: float | None = None
          ) -> tuple[float | None, float]:
    """Module events per second over the last ``window_s`` seconds up to ``until`` (the
    end of the run; the last event when None or earlier), and the span used.

    Counts intervals, not events: n events spread over s seconds are (n - 1) / s per second.
    A silence after the last event longer than MIN_RATE_SPAN_S and than SILENCE_INTERVALS
    mean intervals is part of the pace (the span reaches to ``until``): events that came in a
    burst and then stopped give the pace since the burst, not the burst's. None under
    MIN_RATE_SPAN_S.
    """
    if len(module_events) < 2:
        return None, 0.0
    last = module_events[-1]["t"]
    end = max(last, until if until is not None else last)
    recent = [event for event in module_events if event["t"] >= end - window_s]
    if len(recent) < 2:
        return None, end - recent[0]["t"] if recent else 0.0
    span = last - recent[0]["t"]
    if end - last > max(MIN_RATE_SPAN_S, SILENCE_INTERVALS * span / (len(recent) - 1)):
        span = end - recent[0]["t"]
    if span < MIN_RATE_SPAN_S:
        return None, span
    # an aggregated event of a watched process stands for "edges" block edges
    return sum(event.get("edges", 1) for event in recent[1:]) / span, span


def _in_step_fraction(events: Sequence[dict], step: int) -> float:
    """Position inside step ``step`` from its heartbeats: 0 in forward (its length is not
    known yet), 0.5 + half the backward events per forward event in backward, 1 in the
    optimizer. The phase is the one the last event of the step belongs to ("start" events
    open phases); backward emits about as many backward module events as forward did."""
    current = [event for event in events if event.get("step") == step]
    if not current:
        return 0.0
    phase = current[-1].get("phase")
    if phase == "optimizer":
        return 1.0
    if phase != "backward":
        return 0.0
    modules = module_events(current)
    forward = sum(1 for event in modules if event.get("phase") == "forward")
    backward = sum(1 for event in modules if event.get("phase") == "backward")
    return 0.5 + 0.5 * min(1.0, backward / forward) if forward else 0.5


def _elapsed_since_start(events: Sequence[dict], started_t: float | None) -> float | None:
    """Seconds from the run's first event (seq 0, the "build" start) to the last one; from
    ``started_t`` when that event is no longer among ``events`` (a long run keeps only its
    last events)."""
    if not events:
        return None
    starts = [event for event in events if event.get("seq") == 0 or
              (event.get("kind") == "start" and event.get("phase") == "build")]
    first = starts[0]["t"] if starts else started_t
    return events[-1]["t"] - first if first is not None else None


def _fraction_from_steps(events: Sequence[dict], total_steps: int) -> float | None:
    """(finished steps + position in the current step) / total steps."""
    if not events or total_steps <= 0:
        return None
    last = events[-1]
    if last.get("kind") in ("step", "end"):
        return min(1.0, (int(last.get("step", 0)) + 1) / total_steps)
    step = int(last.get("step", 0))
    return min(1.0, (step + _in_step_fraction(events, step)) / total_steps)


def progress(events: Sequence[dict], expected_events_per_step: int | None, total_steps: int,
             *, module_events_done: int | None = None, started_t: float | None = None,
             window_s: float = RATE_WINDOW_S, ended_t: float | None = None) -> Progress:
    """Rate, fraction done and ETA of a run from its last heartbeat events.

    ``module_events_done`` is the number of module events of the whole run (the runner's
    count); when omitted the module events in ``events`` are counted, which is exact only
    when ``events`` holds the whole heartbeat file. With ``expected_events_per_step`` the
    fraction is events done / (events per step * total steps) and the ETA is the events
    left at the current rate; without it the fraction comes from steps and the in-step
    position, and the ETA extrapolates the time since the start event (or since
    ``started_t``, the process start, when that event is not among ``events``).
    ``ended_t`` is when the run was stopped: the rate's window reaches to it.
    """
    modules = module_events(events)
    done = sum(event.get("edges", 1) for event in modules) if module_events_done is None \
        else module_events_done
    rate, span = _rate(modules, window_s, ended_t)
    if expected_events_per_step and total_steps > 0:
        expected = expected_events_per_step * total_steps
        fraction = min(1.0, done / expected)
        eta = max(0, expected - done) / rate if rate else None
        return Progress(rate, span, done, expected, fraction, eta, "module events")
    fraction = _fraction_from_steps(events, total_steps)
    elapsed = _elapsed_since_start(events, started_t)
    eta = elapsed * (1 - fraction) / fraction if fraction and elapsed is not None else None
    return Progress(rate, span, done, None, fraction, eta, "steps and in-step position")

