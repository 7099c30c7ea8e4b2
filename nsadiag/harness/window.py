"""Live processes sampled over one observation window, without restarting, pausing for long
or killing them; what each reads as is nsadiag.verdict.window's.

``sample_window(pid, rank, duration_s)`` takes, over ``duration_s`` seconds: ``SAMPLES``
stack samples spread over the window (py-spy's nonblocking dump, which does not pause the
process; the faulthandler dump when py-spy cannot attach and nsadiag armed the process's
faulthandler: see nsadiag.probes.stacks), the CPU time it used and its main thread's on-CPU
and run-queue time over the same window (nsadiag.harness.jobs.capture_stall), two native
samples at the end when its Python stacks did not move (py-spy pauses the process for
those: what native call the frozen line is in), and, for a process nsadiag already watches
(under ``nsadiag run`` or ``nsadiag.watch()``: it holds its events.jsonl open), the
heartbeat it wrote meanwhile. ``sample_all`` samples several processes over the same
window, a thread each, and decides across them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from nsadiag.evidence import StallEvidence
from nsadiag.harness.capture import capture_stall, sample_stacks
from nsadiag.harness.streams import EventTail
from nsadiag.harness.times import SAMPLE_TIMEOUT_S
from nsadiag.probes import frames, stacks
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.progress import is_progress
from nsadiag.verdict.window import decide_job, judge_window, state_of

SAMPLES = 6
NATIVE_SAMPLES = 2
NATIVE_INTERVAL_S = 0.5
NATIVE_RESERVE = 0.25
NATIVE_RESERVE_S = 3.0
"""The last part of the window kept for the native samples: this share, at most this
long."""
NATIVE_DUMP_S = 0.3
"""About how long a native dump takes: the last one starts this long before the end."""


@dataclass
class WindowObservation:
    """One process over the window: the evidence decided on (samples and CPU, see
    ``with_native_frames``), the heartbeat events it wrote meanwhile (None: it has no
    nsadiag heartbeat), every nonblocking sample of the window, and what it reads as."""

    pid: int
    rank: int | None
    cmdline: str
    stall: StallEvidence
    events: list[dict[str, Any]] | None
    window_samples: list[Any] = field(default_factory=list)
    verdict: Verdict | None = None
    user_frame: str | None = None
    collective_frame: str | None = None
    signature: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        return state_of(self.verdict.name if self.verdict else "?")

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "cmdline": self.cmdline,
                "state": self.state, "verdict": self.verdict.to_dict() if self.verdict else None,
                "cpu_fraction": self.stall.cpu_fraction(), "user_frame": self.user_frame,
                "collective_frame": self.collective_frame, "signature": self.signature,
                "heartbeat_events": None if self.events is None else len(self.events),
                "stall": self.stall.to_dict(),
                "window_samples": [sample.to_dict() for sample in self.window_samples]}


def native_reserve(duration_s: float) -> float:
    """The end of the window kept for the native samples (NATIVE_RESERVE of it, at most
    NATIVE_RESERVE_S)."""
    return min(NATIVE_RESERVE_S, NATIVE_RESERVE * duration_s)


def sample_window(pid: int, rank: int | None, duration_s: float, samples: int = SAMPLES
                  ) -> WindowObservation:
    """Watch one process for `duration_s` (see the module docstring) and judge it; never
    raises for a process that goes away (its evidence says what could not be taken). The
    samples are taken against a deadline, the nonblocking ones before the window's last
    part and the native ones in it, so the whole lasts about `duration_s` however slow
    py-spy is on a loaded machine (more by what a native dump takes beyond the window: a
    sample's time at most)."""
    ends = time.monotonic() + duration_s
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        cmdline = ""
    heartbeat = stacks.open_file_named(pid, "events.jsonl")
    tail = EventTail(heartbeat) if heartbeat is not None else None
    if tail is not None:
        tail.read_new()  # what it wrote before the window is not the window's
    sampling = duration_s - native_reserve(duration_s)
    window = capture_stall(pid, duration_s, sampling, None, timeout_s=SAMPLE_TIMEOUT_S,
                           count=samples, native=False, dump=False,
                           deadline=time.monotonic() + sampling)
    events = tail.read_new() if tail is not None else None
    progressed = any(is_progress(event) for event in events or [])
    stall = window if progressed else with_native_frames(pid, window, ends)
    observation = WindowObservation(pid, rank, cmdline, stall, events,
                                    window_samples=window.samples)
    observation.verdict = judge_window(stall, events, duration_s)
    found = frames.find_collective(stall.samples)
    own = frames.user_frame(stall.samples)
    observation.collective_frame = found[1].where() if found else None
    observation.user_frame = own[0].where() if own else None
    observation.signature = " | ".join(
        part for part in (observation.collective_frame, observation.user_frame) if part) or (
        frames.stack_signature(stall.samples[-1]) if stall.samples else "")
    return observation


def with_native_frames(pid: int, window: StallEvidence, ends: float | None = None
                       ) -> StallEvidence:
    """The window's evidence to decide on. When its Python stacks did not move (or none was
    taken), NATIVE_SAMPLES native samples are taken at its end (py-spy pauses the process
    for each), before ``ends`` (a time.monotonic() reading) when given, and decide together
    with the window's last two: what native call the frozen Python line sits in (a
    collective, a lock, a kernel). Moving stacks are kept as they are."""
    samples = window.samples
    if len(samples) >= 2 and frames.stacks_change(samples, python_only=True):
        return window
    left = None if ends is None else ends - time.monotonic()
    # what native call a frozen line sits in decides between a lock, a collective and a
    # kernel: one native sample is taken even when slow samples spent the window, and each
    # gets its full time (a first native dump of a big process reads its symbols)
    count = NATIVE_SAMPLES if left is None or left > NATIVE_DUMP_S * NATIVE_SAMPLES else 1
    interval = NATIVE_INTERVAL_S if left is None else \
        max(0.0, (left - NATIVE_DUMP_S) / max(NATIVE_SAMPLES - 1, 1))
    native, unavailable = sample_stacks(pid, count, interval, timeout_s=SAMPLE_TIMEOUT_S)
    taken = samples[-2:] + native
    return dataclasses.replace(window, samples=taken,
                               unavailable=sorted(set(window.unavailable + unavailable)),
                               stacks_class=frames.classify(taken) if taken else None)


def sample_all(targets: Sequence[tuple[int, int | None]], duration_s: float,
               samples: int = SAMPLES) -> tuple[Verdict, list[WindowObservation]]:
    """Every (pid, rank) of ``targets`` sampled over the same window (a thread each), and
    the verdict across them (nsadiag.verdict.window.decide_job)."""
    found: dict[int, WindowObservation] = {}

    def one(target: int, rank: int | None) -> None:
        found[target] = sample_window(target, rank, duration_s, samples)

    threads = [threading.Thread(target=one, args=t) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    observations = [found[p] for p, _ in targets]
    return decide_job(observations, duration_s), observations
