"""The heartbeat streams of one job, and its stall and budget clock (``StallClock``).

A job writes one heartbeat file per process (nsadiag.harness.heartbeat): a trial child,
every rank of a torchrun job, every Python process of a user's own command. The clock
tails them all (``StallClock``) and keeps two clocks for the whole job:

stall   no progress in any stream for the stall timeout. Progress is what
        nsadiag.verdict.progress.is_progress says: a heartbeat event that marks work (a
        block entered or left, a step ended, a collective) or a pulse of the progress
        sampler that saw progress (a loop iterating, autograd nodes running). Until the
        first forward event the limit is at least the start-up grace (STARTUP_GRACE_S
        unless the job's spec says otherwise) while a process may be starting Python,
        importing torch or building the model: busy on the CPU, or too busy in native
        code to send pulses. A process whose pulses show its main thread waiting (on the
        CPU or asking for it WAITING_CPU_SHARE of the time or less since its last progress: a
        lock, a queue, a sleep) is doing none of these: once every
        process waits, the plain stall timeout holds (a lock wait before the first
        forward is a stall at the stall timeout). The clock counts the time the processes
        could have used: the run-queue wait of a stream's main thread (time it wanted
        the CPU and a loaded machine did not give it) does not count, so a busy machine
        does not turn a slow step into a stall; after STALL_STRETCH stall windows of wall time
        the stall is declared anyway, and the verdict says the machine was contended. A
        process whose main thread is blocked reading a terminal (an ``input()`` prompt
        waiting for a person's answer), or joins a thread that is, holds the stall clock:
        waiting for a person is not a stall (nsadiag.probes.waits.PersonWait; the live
        status line says so of a main thread's prompt).
budget  the job's wall time reached the budget while it still progressed. A stream whose
        last step finished (its final "step" or "end" event) is not cut off: the job gets
        FINISH_GRACE_S more to write its results and exit.

The clock only reads; the watch session (nsadiag.harness.session) captures evidence
and stops the processes.
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsadiag.harness.heartbeat import OpenBackward
from nsadiag.harness.machine import main_thread_clock
from nsadiag.harness.slot import read_slot
from nsadiag.probes.waits import PersonWait
from nsadiag.spec import STARTUP_GRACE_S
from nsadiag.verdict.progress import is_progress
from nsadiag.verdict.thresholds import STALL_STRETCH, WAITING_CPU_SHARE, WAITING_MIN_S

UNBOUNDED_STEPS = 2**62
"""The step count of a stream with none (a user's process): it ends when the process does."""
KEEP_EVENTS = 400
KEEP_PULSES = 120
FINISH_GRACE_S = 10.0


class EventTail:
    """Reads the complete lines appended to a JSONL file since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn line from a killed writer carries nothing reliable
        return events


def event_weight(event: dict[str, Any]) -> int:
    """How many events of its kind an event stands for: a thinned step event the steps
    since the one before it (``steps``, nsadiag.harness.heartbeat.THIN_BURST_BYTES), every
    other event itself."""
    steps = event.get("steps") if event.get("kind") == "step" else None
    return steps if isinstance(steps, int) and steps > 0 else 1


def run_queue_seconds(pid: int) -> float | None:
    """Seconds the main thread of `pid` has waited on a run queue; None when unreadable."""
    clock = main_thread_clock(pid)
    return clock[1] if clock is not None else None


@dataclass
class Stream:
    """What the clock has seen of one process's heartbeat file."""

    name: str
    path: Path
    total_steps: int
    tail: EventTail = field(init=False)
    last: deque = field(default_factory=lambda: deque(maxlen=KEEP_EVENTS))
    pulses: deque = field(default_factory=lambda: deque(maxlen=KEEP_PULSES))
    counts: Counter = field(default_factory=Counter)
    backward: OpenBackward = field(default_factory=OpenBackward)
    collectives: list[dict[str, Any]] = field(default_factory=list)
    pid: int | None = None
    rank: int | None = None  # from the "start" event: the torchrun rank of the process
    names: dict[str, Any] | None = None  # its host, global, local and node rank (nsadiag.ranknames)
    started_training: bool = False
    finished: bool = False
    runq_mark: float | None = None  # run-queue seconds at the job's last progress
    # (t, seconds the main thread was on the CPU or waiting for one) of a progress pulse
    # and of the latest pulse
    cpu_at_progress: tuple[float, float] | None = None
    cpu_now: tuple[float, float] | None = None
    seq_seen: int = -1  # the highest seq taken, from the file or its slot
    lost: str | None = None  # why the file stopped (a full disk), from its slot
    lost_t: float | None = None
    thinned_t: float | None = None  # when its first thinned step event was written
    # the slot's counts that its events taken stood for (the rest are counted as they come)
    slot_counted: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.tail = EventTail(self.path)

    def read_new(self) -> list[dict[str, Any]]:
        """The events written since the last read: the file's, or, when it gives none, what
        its slot holds that was not taken yet (the file stopped: a full disk;
        nsadiag.harness.slot). Take them with ``add``."""
        events = self.tail.read_new()
        if events:
            return events
        slot = read_slot(self.path)
        if slot is None:
            return []
        self.lost, self.lost_t = slot.lost, slot.lost_t
        new = [e for e in slot.events if isinstance(e.get("seq"), int) and
               e["seq"] > self.seq_seen]
        taken: Counter = Counter()
        for event in new:
            taken[str(event.get("kind", "?"))] += event_weight(event)
        for kind, total in slot.counts.items():
            # events the slot counted but no longer holds: counted, not seen
            missed = total - self.slot_counted[kind] - taken[kind]
            if missed > 0:
                self.counts[kind] += missed
            self.slot_counted[kind] = max(self.slot_counted[kind], total)
        return new

    def add(self, events: Sequence[dict[str, Any]]) -> bool:
        """Take new events; True when any of them is progress."""
        progressed = False
        for event in events:
            kind = event.get("kind", "?")
            weight = event_weight(event)
            self.counts[kind] += weight
            if weight > 1 and self.thinned_t is None and isinstance(event.get("t"), float):
                self.thinned_t = event["t"]
            if isinstance(event.get("seq"), int):
                self.seq_seen = max(self.seq_seen, event["seq"])
            progressed = progressed or is_progress(event)
            if kind == "pulse":
                self.pulses.append(event)
                self._clock_pulse(event)
                continue
            self.last.append(event)
            self.backward.add(event)
            if kind == "collective":
                self.collectives.append(event)
            if kind == "start" and event.get("pid") and self.pid is None:
                self.pid = int(event["pid"])
                self.rank = event.get("rank")
                self.names = event.get("names")
            if event.get("phase") == "forward":
                self.started_training = True
            if kind == "end" or (kind == "step" and
                                 int(event.get("step", -1)) + 1 >= self.total_steps):
                self.finished = True
        return progressed

    def _clock_pulse(self, pulse: dict[str, Any]) -> None:
        if pulse.get("cpu_s") is None or pulse.get("t") is None:
            return
        wanted = float(pulse["cpu_s"]) + float(pulse.get("runq_s") or 0.0)
        self.cpu_now = (float(pulse["t"]), wanted)
        if pulse.get("progress") or self.cpu_at_progress is None:
            self.cpu_at_progress = self.cpu_now

    def waiting(self) -> bool:
        """Whether the pulses since the process's last progress show its main thread
        waiting: WAITING_MIN_S or more with at most WAITING_CPU_SHARE of it on the CPU or asking for
        it (a thread a loaded machine keeps off the CPU is not waiting)."""
        if self.cpu_now is None or self.cpu_at_progress is None:
            return False
        elapsed = self.cpu_now[0] - self.cpu_at_progress[0]
        used = self.cpu_now[1] - self.cpu_at_progress[1]
        return elapsed >= WAITING_MIN_S and used <= WAITING_CPU_SHARE * elapsed

    def mark_run_queue(self) -> None:
        """Remember the main thread's run-queue seconds now (the job progressed)."""
        self.runq_mark = run_queue_seconds(self.pid) if self.pid else None

    def run_queue_since_mark(self) -> float:
        """Run-queue seconds of the main thread since the mark (0 when unknown)."""
        if not self.pid or self.runq_mark is None:
            return 0.0
        now = run_queue_seconds(self.pid)
        return max(0.0, now - self.runq_mark) if now is not None else 0.0


PERSON_CHECK_S = 1.0
"""Quiet seconds after which the clock asks whether a process waits at a terminal prompt
(two /proc reads a process at every poll from then on)."""


@dataclass
class Due:
    """Why the clock says stop: "stall" or "budget", with the clock readings."""

    reason: str
    quiet_s: float
    opportunity_s: float
    limit_s: float
    stretched: bool  # the stall was declared at STALL_STRETCH windows, not by opportunity


class StallClock:
    """The clocks over a job's streams. ``read()`` takes new events; ``due()`` says when to
    stop; ``streams`` can grow while the job runs (a new process of a user's command)."""

    def __init__(self, streams: list[Stream], stall_timeout_s: float, budget_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 startup_grace_s: float = STARTUP_GRACE_S,
                 awaits_person: Callable[[int], bool] | None = None):
        self.streams = streams
        self.stall_timeout_s, self.budget_s = stall_timeout_s, budget_s
        self.startup_grace_s = startup_grace_s
        self.clock = clock
        self.awaits_person = awaits_person or PersonWait()
        self.started = clock()
        self.last_progress = self.started

    def add_stream(self, stream: Stream) -> None:
        self.streams.append(stream)

    def read(self) -> list[dict[str, Any]]:
        """New events of every stream (pulses included); updates the stall clock."""
        now = self.clock()
        new: list[dict[str, Any]] = []
        progressed = False
        for stream in self.streams:
            events = stream.read_new()
            progressed = stream.add(events) or progressed
            new += events
        if progressed:
            self.last_progress = now
            for stream in self.streams:
                stream.mark_run_queue()
        elif now - self.last_progress >= PERSON_CHECK_S and any(
                stream.pid and not stream.finished and self.awaits_person(stream.pid)
                for stream in self.streams):
            self.last_progress = now  # a prompt waits for its answer: no stall clock runs
        return new

    @property
    def started_training(self) -> bool:
        return any(s.started_training for s in self.streams)

    @property
    def finished(self) -> bool:
        return bool(self.streams) and all(s.finished for s in self.streams)

    def stall_limit(self) -> float:
        if self.started_training or (self.streams and all(s.waiting() for s in self.streams)):
            return self.stall_timeout_s
        return max(self.stall_timeout_s, self.startup_grace_s)

    def quiet_s(self) -> float:
        return self.clock() - self.last_progress

    def stall_now(self) -> Due:
        """A stall declared now, whatever the clock says (another host decided one)."""
        quiet = self.clock() - self.last_progress
        return Due("stall", quiet, quiet, self.stall_limit(), False)

    def due(self) -> Due | None:
        """"stall", "budget" or None (see the module docstring)."""
        now = self.clock()
        quiet, limit = now - self.last_progress, self.stall_limit()
        waited = max((s.run_queue_since_mark() for s in self.streams), default=0.0) \
            if quiet > limit else 0.0
        opportunity = quiet - waited
        if quiet > limit and (opportunity >= limit or quiet >= STALL_STRETCH * limit):
            return Due("stall", quiet, opportunity, limit, opportunity < limit)
        elapsed = now - self.started
        if elapsed > self.budget_s:
            if self.finished and elapsed <= self.budget_s + FINISH_GRACE_S:
                return None
            return Due("budget", quiet, opportunity, limit, False)
        return None
