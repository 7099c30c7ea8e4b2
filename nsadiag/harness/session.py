"""The one parent loop: a process tree watched to its first verdict-worthy moment.

Every watched diagnosis runs this loop: a trial or check job (nsadiag.harness.jobs), a
user's command under ``nsadiag run`` (nsadiag.harness.runcmd) and a block under
``nsadiag.watch()`` (nsadiag.harness.watch_helper). What differs between them is the
``Tree``: how its processes are found and read, how the loop waits between reads, and
whether it is stopped at the end.

``watch_session(tree, times, on_events)`` polls every ``times.poll_s``: new heartbeat
streams join the stall clock (nsadiag.harness.streams), their events are read, and each
main thread's CPU clock is read (nsadiag.harness.machine). When the clock says stop (a
stall, or the budget while it progresses) every process is captured at once
(nsadiag.harness.capture; a stall's capture ends by ``Tree.capture_ends``) and the loop
ends; it also ends when the tree does. The tree is stopped on every way out, Ctrl-C
included (``Tree.stop``: every process killed for a tree nsadiag started, nothing for one
it only watches). ``SessionEnd`` holds what the record
is built from (nsadiag.harness.record); a session the user interrupts raises
``Interrupted`` (a KeyboardInterrupt) with what was seen up to then, a stop already
decided included, so that a caller can keep the diagnosis so far.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from nsadiag.evidence import StallEvidence
from nsadiag.harness import stop
from nsadiag.harness.capture import capture_all, others_evidence
from nsadiag.harness.machine import MainThreadClocks, machine_load
from nsadiag.harness.streams import Due, StallClock, Stream
from nsadiag.harness.times import WatchTimes
from nsadiag.probes.gpu import gpu_state

OnEvents = Callable[[list[dict]], None]


class Tree(ABC):
    """A process tree to watch, with the heartbeat streams known when it starts (more may
    join: ``new_streams``). The defaults suit a tree nsadiag does not stop; each kind of
    watch overrides what differs."""

    def __init__(self, streams: list[Stream]):
        self.pending = list(streams)

    @abstractmethod
    def running(self) -> bool:
        """Whether the tree still runs."""

    def wait(self, seconds: float) -> None:
        """Wait about ``seconds`` before the next read (less when the tree ends)."""
        time.sleep(seconds)

    def new_streams(self) -> list[Stream]:
        """Heartbeat streams that appeared since the last call (at first: those given)."""
        new, self.pending = self.pending, []
        return new

    def unwatched(self, watched: set[int]) -> list[psutil.Process]:
        """The tree's live Python processes that write no heartbeat (sampled at a stall)."""
        return []

    def before_capture(self, due: Due) -> None:
        """Called once the clock says stop, before the processes are sampled; by default
        nothing is done."""
        return None

    def stall_elsewhere(self) -> bool:
        """Whether a stall was decided outside this tree (another host of the job); by
        default never."""
        return False

    def capture_ends(self, window_s: float) -> float:
        """When a stall's capture, called now, must end (a time.monotonic() reading); by
        default ``window_s`` from now."""
        return time.monotonic() + window_s

    def share(self, due: Due, streams: list[Stream], stalls: dict[str, StallEvidence]
              ) -> None:
        """Called with what was captured, before anything is stopped; by default nothing
        is shared."""
        return None

    def after_capture(self, due: Due) -> None:
        """Called after the processes were sampled; by default nothing is done."""
        return None

    def stop(self) -> None:
        """End the tree's processes (called on every way out of the loop); by default
        nothing is stopped (a tree nsadiag only watches)."""
        return None


@dataclass
class SessionEnd:
    """How a session ended: ``due`` is why the clock said stop (None: the tree ended first),
    ``started`` and ``ended_at`` are wall-clock times (``ended_at``: when the clock said
    stop, since capturing takes seconds and pauses the processes, or when the tree ended),
    ``stalls`` the captured evidence by stream name, ``others`` the Evidence.others of the
    processes without a heartbeat, ``load`` the machine's load and each main thread's CPU
    use (nsadiag.harness.machine), ``streams`` every stream read to its end."""

    due: Due | None
    started: float
    ended_at: float
    streams: list[Stream]
    load: dict[str, Any]
    stalls: dict[str, StallEvidence] = field(default_factory=dict)
    gpu: Any = None
    others: list[dict[str, Any]] = field(default_factory=list)
    interrupted_at: float | None = None
    """When the user interrupted the session (time.time()), None when they did not."""

    @property
    def reason(self) -> str | None:
        return self.due.reason if self.due is not None else None

    @property
    def wall_s(self) -> float:
        return self.ended_at - self.started


class Interrupted(KeyboardInterrupt):
    """The user stopped a session (Ctrl-C, SIGTERM, SIGHUP): ``end`` is what it had seen,
    its processes stopped and its streams read to their end."""

    def __init__(self, end: SessionEnd):
        super().__init__()
        self.end = end


def _join_new(tree: Tree, clock: StallClock) -> None:
    for stream in tree.new_streams():
        clock.add_stream(stream)


def watch_session(tree: Tree, times: WatchTimes, on_events: OnEvents | None = None,
                  awaits_person: Callable[[int], bool] | None = None) -> SessionEnd:
    """Watch ``tree`` under ``times`` (see the module docstring). ``on_events`` hears each
    poll's new events (pulses only when nothing else came). ``awaits_person``: whether a
    process waits for an answer at the terminal, the one the status line asks too (None:
    the stall clock's own)."""
    clock = StallClock([], times.stall_timeout_s, times.budget_s,
                       startup_grace_s=times.startup_grace_s, awaits_person=awaits_person)
    clocks = MainThreadClocks()
    load_before = machine_load()
    started = time.time()
    due: Due | None = None
    stalls: dict[str, StallEvidence] = {}
    gpu: Any = None
    others: list[psutil.Process] = []
    decided_at = interrupted_at = None
    try:
        while tree.running():
            stop.check()
            _join_new(tree, clock)
            events = clock.read()
            clocks.read({s.name: s.pid for s in clock.streams})
            if events and on_events:
                on_events([e for e in events if e.get("kind") != "pulse"] or events[-1:])
            due = clock.due() or (clock.stall_now() if tree.stall_elsewhere() else None)
            if due is not None:
                decided_at = time.time()
                pids = {s.name: s.pid for s in clock.streams if s.pid}
                dirs = {s.name: s.path.parent for s in clock.streams}
                tree.before_capture(due)
                ends = tree.capture_ends(times.capture_window_s)
                others = tree.unwatched(set(pids.values()))
                stalls = capture_all(pids, dirs, due, times.capture_window_s, others, ends)
                gpu = gpu_state()
                clock.read()  # the events written up to the capture, for what is shared
                tree.share(due, clock.streams, stalls)
                tree.after_capture(due)
                break
            tree.wait(times.poll_s)
    except KeyboardInterrupt:
        interrupted_at = stop.requested_at() or time.time()
    finally:
        ended_at = decided_at or interrupted_at or time.time()
        clocks.read({s.name: s.pid for s in clock.streams})
        tree.stop()
    _join_new(tree, clock)
    clock.read()  # what was written up to the end: the record reads every stream whole
    end = SessionEnd(due, started, ended_at, clock.streams, clocks.load(load_before),
                     stalls, gpu, others_evidence(others, stalls), interrupted_at)
    if interrupted_at is not None:
        raise Interrupted(end)
    return end
