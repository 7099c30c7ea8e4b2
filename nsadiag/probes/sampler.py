"""Progress below module granularity: a sampler thread inside the watched process.

Every ``interval_s`` (0.1 s) the thread reads the main thread's Python stack
(``sys._current_frames``: no ptrace, no pause) and decides whether the process made
progress since the last sample. Progress is any of:

- a work counter moved (``nsadiag.probes.counters``): module calls, autograd nodes run;
- the heartbeat wrote an event (a block entered or left, a step ended);
- the main thread is in torch.compile's compiler and it, or a process below this one (a
  compile worker, the C++ compiler), used CPU time since the last pulse, for at most
  COMPILE_BOUND_S of one compile (nsadiag.probes.compiler);
- the main thread is in a state never seen since the last progress: its stack (function
  and line of every frame, each once: a frame re-entered above itself, as a signal handler
  that waits where its earlier call waits, is no new state; ``progress_state``) together
  with the integer locals of its user-code frames. A
  ``for t in range(S)`` loop moves ``t`` whether it computes, waits for a GPU or sleeps
  between tokens; a spin (``while not ready(): pass``) or a polling wait without a counter
  revisits the same few states; a native call that never returns, or a lock wait, shows
  one state. (A polling loop that counts its retries therefore reads as progress.)

The main thread's on-CPU and run-queue seconds (``/proc/self/task/TID/schedstat``) go into
every pulse, so the watcher can tell busy from waiting relative to the CPU the thread could
get on a loaded machine. They are read at every sample too: a sample is "on CPU" when the
main thread wanted the CPU (ran or waited for a core) at least half the time since the
previous one, so the profile can tell the lines that burn the CPU from the lines where the
thread waits. A gap between samples
much longer than the interval while the main thread wanted the CPU and the sampler thread
did not wait for a core means native code held the GIL (the sampler thread could not
run): those seconds are counted by phase ("held off").

The process's resident memory (and CUDA memory allocated, once CUDA is initialised) is read
at every sample too, into a ledger (``MemoryLedger``) that attributes each rise to the
user frames on the stack then and gives a rise back when memory falls again: what remains
is the memory still held, by the frames that allocated it (those on the stack at both
readings around the rise) and the steps they did it in. ``mark_memory()`` adds a reading
from the thread that runs the model (nsadiag.harness.watched calls it as each top-level
module call begins and ends), so what a forward allocates goes to the line that called it.

The integer locals are read from the frame's memory (nsadiag.probes.framemem), never
through ``frame.f_locals``: on CPython < 3.13 that writes the frame's locals dict from this
thread, keeps every local alive in it, and crashed a watched process. Only user frames are
read: the innermost one at each sample, and every frame read once again at every sample
while it is on the stack (an outer loop keeps being followed while inner code runs). Where
the frame layout cannot be confirmed no locals are read, and a loop shows only through its
stack states and the work counters.

Outputs:
- ``emit(fields)`` at most every ``pulse_s`` (1 s): a "pulse" heartbeat event with
  ``progress`` (any progress since the last pulse), ``idle_s`` (seconds since the last
  progress), ``frame`` (innermost user frame, "function (file:line)"), ``cpu_s`` (main
  thread CPU seconds), ``calls``, ``nodes``, ``op``, ``samples``, and while the main
  thread compiles ``compiling_s`` (seconds in this compile) and ``compiler`` (the
  compiler's entry frame);
- ``profile.json`` every ``profile_s`` (2 s; further apart for a large profile while the
  process progresses: PROFILE_SHARE) and at stop, written atomically: the sampled
  stacks aggregated by (frames, code line, phase, module, op) with counts and on-CPU
  counts, the loops (integer locals that moved: where the current pass began, the end of
  their ``range`` where the source and the loop's iterator tell it, the phase and module
  they were last read in), the seconds the sampler was held off by phase, and the memory
  ledger, in the format ``nsadiag.probes.profile`` reads and summarizes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import linecache
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from nsadiag.probes.compiler import (
    COMPILE_BOUND_S,
    COMPILE_WORK_S,
    compiler_frame,
    descendants_cpu_s,
)
from nsadiag.probes.counters import WorkCounters
from nsadiag.probes.framemem import FrameReader, read_at, reader
from nsadiag.probes.frames import LIBRARY_PATH
from nsadiag.probes.heap import heap_bytes
from nsadiag.probes.loops import for_loop

INTERVAL_S = 0.1
PULSE_S = 1.0
PROFILE_S = 2.0
PROFILE_SHARE = 0.001
"""While the process progresses, the profile is written no more often than keeps its writes
to this share of the wall time (up to PROFILE_MAX_S apart): a profile's writing holds the
GIL from the model's thread for as long as it takes (5 to 6 ms every 2 s for the 265 KB
profile of a compiled model of 64 small blocks, 0.2 to 0.3 % of its wall time). A write's
cost is this thread's CPU time, not its wall time: on a busy machine a write descheduled
midway took ten times as long by the clock, pushed the next write past a 10 s trial's end,
and the trial, killed at its budget, left a profile of the model's build only. A process
that made no progress since the last pulse gets its profile every PROFILE_S: the profile of
a stall is read soon after it (the run may be ended for it)."""
PROFILE_MAX_S = 10.0
MAX_STATES = 4096
"""States remembered since the last progress; beyond, the oldest half is forgotten."""
MAX_LOCALS = 8
PROFILE_VERSION = 3
READABLE_VERSIONS = (2, 3)
"""Profiles this version of nsadiag reads (version 2 had no on-CPU counts, loop ends,
held-off seconds or memory ledger)."""
ON_CPU_FRACTION = 0.5
"""A sample is on CPU when the main thread wanted the CPU (ran, or waited for a core) at
least this part of the time since the previous sample."""
HELD_OFF_S = 1.0
"""A gap between two samples longer than this (ten intervals) is the sampler held off."""
MAX_SEGMENTS = 1024
"""Memory ledger segments kept; beyond, the smallest are merged into their neighbours."""

Frame = tuple[str, str, int]  # (function, file, line)


@functools.lru_cache(maxsize=4096)
def is_user_file(path: str) -> bool:
    """A file of the user's own code: not the standard library, not an installed package,
    not nsadiag itself, not a synthetic "<...>" file. Remembered per path: the memory marks
    ask it of every frame of the model's thread at each step."""
    return bool(path) and not LIBRARY_PATH.search(path) and "/nsadiag/" not in path


# ---- the decision (pure) ---------------------------------------------------------------------


class ProgressJudge:
    """Decides, sample by sample, whether the process made progress.

    ``observe(work, state)``: ``work`` is a tuple of counters that only grow with work
    done; ``state`` a hashable picture of the main thread. True when a counter moved, or
    when the state was not seen since the last progress (the very first state is not
    progress: there is nothing to compare it with).
    """

    def __init__(self) -> None:
        self._work: tuple[int, ...] | None = None
        self._seen: dict[Hashable, None] = {}

    @property
    def last_work(self) -> tuple[int, ...] | None:
        """The counters of the previous sample."""
        return self._work

    def observe(self, work: tuple[int, ...], state: Hashable) -> bool:
        moved = self._work is not None and work != self._work
        self._work = work
        if moved:
            self._seen = {state: None}
            return True
        if state in self._seen:
            return False
        first = not self._seen
        self._remember(state)
        return not first

    def _remember(self, state: Hashable) -> None:
        if len(self._seen) >= MAX_STATES:
            for key in list(self._seen)[: MAX_STATES // 2]:
                del self._seen[key]
        self._seen[state] = None


# ---- the profile ------------------------------------------------------------------------------


@dataclass
class Loop:
    """An integer local of a user frame seen to change across samples.

    A loop counter rises step by step and restarts when its loop is entered again (the
    next layer, the next step): ``advanced`` sums the rises and ``advancing_s`` the time
    between the samples that saw them, ``restarts`` counts the falls."""

    function: str
    file: str
    line: int
    variable: str
    first: tuple[float, int]
    last: tuple[float, int]
    observations: int = 1
    advanced: int = 0
    advancing_s: float = 0.0
    restarts: int = 0
    entry: tuple[float, int] | None = None  # the first reading of the current pass
    end: int | None = None  # where the loop's range ends, when it could be read
    phase: str | None = None  # the phase and watched module of the last reading
    module: str | None = None

    def update(self, t: float, value: int) -> bool:
        """Take a reading; True when the value changed."""
        if value == self.last[1]:
            return False
        if value > self.last[1]:
            self.advanced += value - self.last[1]
            self.advancing_s += t - self.last[0]
        else:
            self.restarts += 1
            self.entry = (t, value)
            self.end = None  # the next pass may run to another end (the next layer's)
        self.last = (t, value)
        self.observations += 1
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line,
                "variable": self.variable, "first": list(self.first),
                "last": list(self.last), "observations": self.observations,
                "advanced": self.advanced, "advancing_s": round(self.advancing_s, 3),
                "restarts": self.restarts, "entry": list(self.entry or self.first),
                "end": self.end, "phase": self.phase, "module": self.module}


MARK_BUDGET = 0.003
"""The share of the wall time the memory marks on the model's thread may take. Measured
(bench/gil_loop.py, 64 blocks of Linear, LayerNorm and GELU, steps of 7 ms): two marks a
step read the heap in 7 to 60 us each once the model had trained, 2.9 % of the main thread's
samples, the largest part of the observer's cost there. Inside that loop compiled (steps of
4 ms) a reading took 100 to 120 us (its /proc/self/statm read 38 us and its mallinfo2 60 us,
where the same calls take 3 us and 0.4 us in a loop of their own: they start from cold
caches), and at a share of 0.5 % the readings were 0.5 to 0.6 % of the wall time. A chosen
share of the observer's 5 % (issue 32), as the block hooks' (BLOCK_HOOK_BUDGET): a model of
steps of 70 ms or more keeps every mark."""

MARK_CREDIT_S = 0.002
"""The most mark time that time without marks saves up (``MarkBudget``): a burst of marks
after a long quiet stretch (an evaluation, a checkpoint) reads at most this much before
the share applies again. A chosen bound, a few dozen readings."""


class MarkBudget:
    """Whether a memory mark may read now: a leaky bucket that fills at ``share`` of the
    wall time, up to ``credit_s``, and empties by what each reading took."""

    def __init__(self, share: float = MARK_BUDGET, credit_s: float = MARK_CREDIT_S) -> None:
        self.share, self.credit_s = share, credit_s
        self._credit = credit_s
        self._last: float | None = None

    def allows(self, now: float) -> bool:
        if self._last is not None:
            self._credit = min(self.credit_s, self._credit + self.share * (now - self._last))
        self._last = now
        return self._credit > 0

    def spend(self, seconds: float) -> None:
        self._credit -= seconds


class MemoryLedger:
    """Memory above the first reading, attributed to where it rose (see the module
    docstring). ``observe(value, frames, step)`` takes one reading with the user frames
    on the stack (outermost first) and the step; a rise opens a segment [before, after]
    owned by those frames and that step, a fall takes the segments above the new value back
    (the memory given back was the latest taken). ``rises`` counts, per frame, every byte
    that rose while it was on the stack, given back or not."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.last: int | None = None
        self.peak = 0
        self.segments: list[list[Any]] = []  # [low, high, frames, step], low rising
        self.rises: Counter = Counter()

    def observe(self, value: int, frames: tuple[Frame, ...], step: int) -> None:
        if self.last is None:
            self.first = self.last = self.peak = value
            return
        if value > self.last:
            for frame in set(frames):
                self.rises[frame] += value - self.last
            top = self.segments[-1] if self.segments else None
            if top is not None and top[1] == self.last and top[2] == frames and top[3] == step:
                top[1] = value
            else:
                self.segments.append([self.last, value, frames, step])
            if len(self.segments) > MAX_SEGMENTS:
                self._merge_smallest()
        elif value < self.last:
            while self.segments and self.segments[-1][0] >= value:
                self.segments.pop()
            if self.segments and self.segments[-1][1] > value:
                self.segments[-1][1] = value
        self.last = value
        self.peak = max(self.peak, value)

    def _merge_smallest(self) -> None:
        sizes = [high - low for low, high, _, _ in self.segments[1:]]
        index = 1 + sizes.index(min(sizes))
        self.segments[index - 1][1] = self.segments[index][1]
        del self.segments[index]

    def holders(self, top: int = 8) -> list[dict[str, Any]]:
        """The frames holding memory now, most first: bytes held, the steps they took it
        in, the bytes that ever rose under them, and their depth (0 = outermost)."""
        held: Counter = Counter()
        steps: dict[Frame, set[int]] = {}
        depth: dict[Frame, int] = {}
        for low, high, frames, step in self.segments:
            for index, frame in enumerate(frames):
                held[frame] += high - low
                steps.setdefault(frame, set()).add(step)
                depth[frame] = max(depth.get(frame, 0), index)
        return [{"frame": list(frame), "held": n, "steps": len(steps[frame]),
                 "rose": self.rises[frame], "depth": depth[frame]}
                for frame, n in held.most_common(top)]

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last, "peak": self.peak,
                "held": sum(high - low for low, high, _, _ in self.segments),
                "holders": self.holders()}


@dataclass
class ProfileBook:
    """Sampled stacks counted by (frames, code, phase, module, op), and the loops."""

    interval_s: float
    pid: int = field(default_factory=os.getpid)
    first_t: float | None = None
    last_t: float | None = None
    samples: int = 0
    stacks: Counter = field(default_factory=Counter)
    on_cpu: Counter = field(default_factory=Counter)
    loops: dict[tuple[str, str, str], Loop] = field(default_factory=dict)
    held_off_s: Counter = field(default_factory=Counter)  # phase -> seconds
    memory: dict[str, MemoryLedger] = field(default_factory=dict)  # "rss", "cuda"

    def add(self, t: float, frames: tuple[Frame, ...], code: str | None, phase: str | None,
            module: str | None, op: str | None, on_cpu: bool = False) -> None:
        self.first_t = t if self.first_t is None else self.first_t
        self.last_t = t
        self.samples += 1
        key = (frames, code, phase, module, op)
        self.stacks[key] += 1
        self.on_cpu[key] += on_cpu

    def see_locals(self, t: float, frame: Frame, ints: dict[str, int],
                   end_of: Callable[[int], int | None] | None = None,
                   phase: str | None = None, module: str | None = None) -> None:
        """Readings of a frame's integer locals; one Loop per (function, file, variable),
        at the first line it was read at, whichever line the frame is on now. ``end_of``
        (a value -> where the running ``range`` loop that yielded it ends) gives a moving
        loop counter of a ``for ... in range(...)`` statement its end."""
        function, file, line = frame
        for name, value in ints.items():
            key = (function, file, name)
            loop = self.loops.get(key)
            if loop is None:
                self.loops[key] = Loop(function, file, line, name, (t, value), (t, value))
                continue
            if loop.update(t, value):
                loop.phase, loop.module = phase, module
                # the source is parsed once a local moved twice: a loop, not a value
                if loop.end is None and end_of is not None and loop.observations >= 3:
                    source = for_loop(file, function, name)
                    if source is not None and source.end is not None:
                        loop.end = end_of(value)

    def to_dict(self) -> dict[str, Any]:
        stacks = [{"frames": [list(f) for f in frames], "code": code, "phase": phase,
                   "module": module, "op": op, "count": count,
                   "on_cpu": self.on_cpu[(frames, code, phase, module, op)]}
                  for (frames, code, phase, module, op), count in self.stacks.most_common()]
        loops = [loop.to_dict() for loop in self.loops.values() if loop.observations > 1]
        return {"version": PROFILE_VERSION, "pid": self.pid, "interval_s": self.interval_s,
                "first_t": self.first_t, "last_t": self.last_t, "samples": self.samples,
                "stacks": stacks, "loops": loops,
                "held_off_s": {phase: round(s, 3) for phase, s in self.held_off_s.items()},
                "memory": {kind: ledger.to_dict() for kind, ledger in self.memory.items()}}

    def write(self, path: Path) -> None:
        """Replace ``path`` whole; a write that fails (a full disk) leaves the profile
        before it and no temporary."""
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


# ---- reading the main thread ---------------------------------------------------------------


def progress_state(stack: tuple[Frame, ...], ints: tuple[tuple[str, int], ...]
                   ) -> tuple[tuple[Frame, ...], tuple[tuple[str, int], ...]]:
    """The picture of the main thread whose novelty counts as progress: its stack and its
    integer locals, each frame and each (name, value) once. A frame already on the stack
    that appears again above it (a signal handler re-entered every second while its earlier
    call still waits for a lock, the same callback nested again) adds no new state: stack
    movement alone is no work done."""
    return tuple(dict.fromkeys(stack)), tuple(dict.fromkeys(ints))


def stack_of(frame: FrameType | None) -> tuple[Frame, ...]:
    """(function, file, line) of every frame, outermost first."""
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append((code.co_name, code.co_filename, frame.f_lineno or 0))
        frame = frame.f_back
    frames.reverse()
    return tuple(frames)


def user_stack_of(frame: FrameType | None) -> tuple[Frame, ...]:
    """``stack_of`` less the frames outside the user's files, without computing their
    lines (what a memory mark on the model's thread costs is mostly this walk)."""
    frames = []
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            frames.append((code.co_name, code.co_filename, frame.f_lineno or 0))
        frame = frame.f_back
    frames.reverse()
    return tuple(frames)


USER_FRAME_DEPTH = 16
"""How far out of a hook a memory mark looks for the user's frame that called it."""


def innermost_user_frame(depth_hint: int, base: int = 1) -> tuple[FrameType | None, int]:
    """The innermost frame of the user's code among the USER_FRAME_DEPTH frames from the
    caller's caller outward (``base``: the caller's caller is that many frames out of the
    caller), and its depth counted from there (None, 0 when none is that close).

    ``depth_hint`` is the depth found before: a module hook is called from the same depth
    at every call, and ``sys._getframe(depth)`` makes no frame object for the frames it
    passes, where a walk through ``f_back`` makes one for each (on CPython 3.11 those were
    most of a mark's cost: 8 us where the walk went through six frames of torch's and
    nsadiag's hooks, 3 us where they already had one). When the frame at the hinted depth
    is a user's it is taken without looking at the frames inside it; if one of those was a
    user's too, the stack from the frame taken outward is a part of the true one, and the
    marks only ever narrow to it (a rise then goes to fewer, outer frames: less precise,
    never another call's)."""
    if depth_hint:
        try:
            frame = sys._getframe(base + 1 + depth_hint)
        except ValueError:  # a shallower stack than last time
            frame = None
        if frame is not None and is_user_file(frame.f_code.co_filename):
            return frame, depth_hint
    frame = sys._getframe(base + 1)
    for depth in range(USER_FRAME_DEPTH):
        if frame is None:
            break
        if is_user_file(frame.f_code.co_filename):
            return frame, depth
        frame = frame.f_back
    return None, 0


def frame_key(frame: FrameType | None) -> tuple[int, ...] | None:
    """A user frame as numbers only: its identity, code and instruction, and the instruction
    its caller is at (None for None). Frames out of a frame that is alive and at the same
    instruction are the same frames, so a memory mark whose caller has the key of a stack
    already seen since the last reading needs no walk of its own (``Sampler.mark_memory``).
    The instruction (``f_lasti``), not the line: a frame's line is found by a scan of its
    code's line table, long for a training script's module-level loop. No frame is kept: a
    kept frame would keep its locals, the user's tensors, alive. A frame freed and another
    made at its address, of the same code, at the same instruction, called from the same
    instruction, reads as the same: at worst a rise is given to the frames of that earlier
    stack."""
    if frame is None:
        return None
    back = frame.f_back
    return (id(frame), id(frame.f_code), frame.f_lasti, id(back),
            back.f_lasti if back is not None else -1)


def frames_of(frame: FrameType | None) -> list[FrameType]:
    found = []
    while frame is not None:
        found.append(frame)
        frame = frame.f_back
    return found  # innermost first


class ThreadClock:
    """On-CPU and run-queue nanoseconds of one thread, from /proc/self/task/TID/schedstat
    (falls back to the process CPU time when schedstat is unreadable). The file stays open:
    the sampler reads it at every sample."""

    def __init__(self, native_id: int | None):
        self._path = f"/proc/self/task/{native_id}/schedstat" if native_id else None
        self._fd: int | None = None

    def read(self) -> tuple[float, float]:
        """(on-CPU seconds, run-queue seconds)."""
        if self._path:
            try:
                if self._fd is None:
                    self._fd = os.open(self._path, os.O_RDONLY)
                run_ns, wait_ns, _ = (read_at(self._fd, 128, 0, partial=True) or b"").split()
                return int(run_ns) / 1e9, int(wait_ns) / 1e9
            except (OSError, ValueError):
                self.close()
                self._path = None
        return time.process_time(), 0.0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---- the thread -------------------------------------------------------------------------------


Context = Callable[[], tuple[str | None, str | None]]  # -> (phase, module)


def cuda_allocated() -> int | None:
    """torch.cuda.memory_allocated() once something initialised CUDA, else None (torch is
    never imported here)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return int(cuda.memory_allocated()) if cuda is not None and cuda.is_initialized() \
            else None
    except (AttributeError, RuntimeError):
        return None


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(statm: int) -> int:
    """Resident bytes of this process from an open /proc/self/statm descriptor."""
    return int((read_at(statm, 128, 0, partial=True) or b"0 0").split()[1]) * PAGE_BYTES


class Sampler(threading.Thread):
    """The sampler thread (see the module docstring). ``start()`` then ``stop()``."""

    def __init__(self, emit: Callable[[dict[str, Any]], None], profile_path: Path | None,
                 counters: WorkCounters | None = None, context: Context | None = None,
                 events: Callable[[], int] | None = None, interval_s: float = INTERVAL_S,
                 pulse_s: float = PULSE_S, profile_s: float = PROFILE_S,
                 main: threading.Thread | None = None,
                 step: Callable[[], int] | None = None,
                 on_sample: Callable[[], None] | None = None):
        """``on_sample`` runs after every sample on this thread (a watched process's block
        events, written here so the model's own hooks only count, and the installing of
        its torch hooks: nsadiag.harness.watched; on this thread's wake-ups, so that no
        other thread of ours takes the GIL from the main thread)."""
        super().__init__(name="nsadiag-sampler", daemon=True)
        self._emit, self._profile_path = emit, profile_path
        self._counters = counters
        self._context = context or (lambda: (None, None))
        self._events = events or (lambda: 0)
        self._step = step or (lambda: 0)
        self._on_sample = on_sample
        self._interval, self._pulse_s, self._profile_s = interval_s, pulse_s, profile_s
        main = main or threading.main_thread()
        self._main_ident = main.ident
        self._clock = ThreadClock(main.native_id)
        self._judge = ProgressJudge()
        self.book = ProfileBook(interval_s)
        self._watched_frames: set[int] = set()
        self._frames: FrameReader | None = None  # set when the thread runs
        self._stop_event = threading.Event()
        self._progress_since_pulse = False
        self._last_progress = time.monotonic()
        self._last_user_frame: str | None = None
        self._compiler: Frame | None = None  # the compiler's entry frame while compiling
        self._compile_started: float | None = None
        self._compile_work: float | None = None  # CPU seconds at the previous pulse
        self._previous: tuple[float, float, float] | None = None  # t, on-CPU, run queue
        self._previous_stack: set[Frame] = set()
        self._memory_lock = threading.Lock()  # readings come from hooks too
        self._mark_budget = MarkBudget()
        self._marks_skipped = False  # a mark read nothing since the last reading
        self._keys_seen: set[tuple[int, ...]] = set()  # marks' callers since the last reading
        self._user_depth = 0  # where the marks' caller found its user frame last time
        self._own_clock: ThreadClock | None = None  # this thread's, set when it runs
        self._own_runq = 0.0
        try:
            self._statm: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._statm = None
        self.failures = 0

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop sampling, emit a last pulse and write the profile once more."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)

    def run(self) -> None:
        self._frames = reader()
        self._own_clock = ThreadClock(threading.get_native_id())
        self._own_runq = self._own_clock.read()[1]
        next_pulse = next_profile = time.monotonic()
        while not self._stop_event.wait(self._interval):
            now = time.monotonic()
            pulse, profile = now >= next_pulse, now >= next_profile
            self._guarded(self._sample)
            if self._on_sample is not None:
                self._guarded(self._on_sample)
            if pulse:
                self._guarded(self._pulse)
                next_pulse = now + self._pulse_s
            if profile and self._profile_path is not None:
                started = time.thread_time()
                self._guarded(self._write_profile)
                next_profile = now + self._profile_gap(time.thread_time() - started)
        self._compiler = None  # the last pulse compares no compile (its thread may be gone)
        self._guarded(self._pulse)
        if self._profile_path is not None:
            self._guarded(self._write_profile)
        with self._memory_lock:
            if self._statm is not None:
                os.close(self._statm)
                self._statm = None
        self._clock.close()
        if self._frames is not None:
            self._frames.close()
            self._frames = None
        if self._own_clock is not None:
            self._own_clock.close()

    def _profile_gap(self, took_s: float) -> float:
        """Seconds to the next profile write after one that took ``took_s`` (PROFILE_SHARE)."""
        if time.monotonic() - self._last_progress > self._pulse_s:
            return self._profile_s
        return min(PROFILE_MAX_S, max(self._profile_s, took_s / PROFILE_SHARE))

    def _write_profile(self) -> None:
        with self._memory_lock:  # the ledgers also take readings from the model's hooks
            self.book.write(self._profile_path)

    def _guarded(self, action: Callable[..., Any], *args: Any) -> None:
        """Run one step of the thread; a failure (e.g. a full disk, a module half imported
        by the main thread) skips that step and is counted, never kills the thread."""
        try:
            action(*args)
        except Exception:  # the sampler must outlive anything the watched process does
            self.failures += 1

    def _sample(self) -> None:
        frame = sys._current_frames().get(self._main_ident)
        if frame is None:  # the thread ended: no compile of its own goes on
            self._compiler = self._compile_started = self._compile_work = None
            return
        t = time.time()
        on_cpu_s, runq_s = self._clock.read()
        phase, module = self._context()
        stack = stack_of(frame)
        self._compiler = compiler_frame(stack)
        if self._compiler is None:
            self._compile_started = self._compile_work = None
        elif self._compile_started is None:
            self._compile_started = time.monotonic()
        user = [f for f in frames_of(frame) if is_user_file(f.f_code.co_filename)]
        work = self._work()
        ints = self._loop_state(t, user, phase, module)
        state = progress_state(stack, ints)
        del frame, user
        if self._judge.observe(work, state):
            self._progress_since_pulse = True
            self._last_progress = time.monotonic()
        op = self._counters.op if self._counters and self._counters.in_backward else None
        user_stack = tuple(f for f in stack if is_user_file(f[1]))
        innermost_user = user_stack[-1] if user_stack else None
        self._last_user_frame = (f"{innermost_user[0]} ({Path(innermost_user[1]).name}:"
                                 f"{innermost_user[2]})" if innermost_user else None)
        code = (linecache.getline(stack[-1][1], stack[-1][2]).strip() or None) if stack else None
        self.book.add(t, stack, code, phase, module, op,
                      self._timing(t, on_cpu_s, runq_s, phase))
        self._memory(user_stack)

    def _timing(self, t: float, on_cpu_s: float, runq_s: float, phase: str | None) -> bool:
        """Whether the main thread wanted the CPU (ran, or waited for a core on a loaded
        machine) since the previous sample; a long gap while it ran counts as held off
        (native code holding the GIL), by phase."""
        previous, self._previous = self._previous, (t, on_cpu_s, runq_s)
        if previous is None:
            return False
        elapsed, ran = t - previous[0], on_cpu_s - previous[1]
        wanted = ran + runq_s - previous[2]
        own_runq = self._own_clock.read()[1] if self._own_clock is not None else 0.0
        starved, self._own_runq = own_runq - self._own_runq, own_runq
        # a gap while the main thread wanted the CPU and this thread did not wait for a
        # core (a loaded machine's scheduler would show as run-queue time) is the GIL
        if elapsed > HELD_OFF_S and wanted >= ON_CPU_FRACTION * elapsed and \
                starved < ON_CPU_FRACTION * elapsed:
            # the phase at the end of the gap: where the code that held the GIL ran
            self.book.held_off_s[phase or "other"] += elapsed - self._interval
        return elapsed > 0 and wanted >= ON_CPU_FRACTION * elapsed

    def _memory(self, user_stack: tuple[Frame, ...]) -> None:
        """One reading of resident and CUDA memory into the ledgers. A rise happened
        somewhere between the previous reading and this one, so it is attributed to the
        frames on both stacks only (a rise seen just after a line returned is not that
        line's, nor the next one's)."""
        with self._memory_lock:
            previous, self._previous_stack = self._previous_stack, set(user_stack)
            self._marks_skipped = False
            self._keys_seen.clear()
            self._observe_memory(tuple(frame for frame in user_stack if frame in previous))

    def mark_memory(self) -> None:
        """A reading of memory now, on the thread that calls it: a hook calls it as a
        top-level module call begins and ends, so what the call allocated is attributed
        exactly to the line of the user's code that made it (the validation forward whose
        graph a list keeps, not the training forward beside it).

        A reading costs the model's thread its time (``mallinfo2`` walks the heap's free
        lists: 1 us in a fresh process, 7 us and more once a model has trained; inside a
        loop of 8 ms steps a reading took 90 us, its stack walk included), so the marks
        keep to MARK_BUDGET of the wall time (``MarkBudget``). A mark over budget reads
        nothing and only narrows the frames a later rise may be given to: whatever rises
        until the next reading belongs to the frames on every stack seen since the last
        one, as between two samples, never to one call that may not have made it. A mark
        whose caller was seen since the last reading (``frame_key``: the same live frame
        at the same instruction) narrows nothing more and walks no stack: in a training loop,
        every mark over budget but the first after a reading. The caller's frame is found
        at the depth it was found at before (``innermost_user_frame``)."""
        started = time.perf_counter()
        with self._memory_lock:
            if not self._mark_budget.allows(started):
                user, self._user_depth = innermost_user_frame(self._user_depth)
                key = frame_key(user)
                if key is not None and key in self._keys_seen:
                    return
                # no user frame close to the hook: the whole stack is walked
                self._previous_stack &= set(user_stack_of(
                    user if user is not None else sys._getframe(1)))
                self._marks_skipped = True
                if key is not None:
                    self._keys_seen.add(key)
                return
            # a reading walks the whole stack, and keys its innermost user frame found by a
            # walk: the frame at the hinted depth may have another inside it, and a later
            # mark keyed by that outer frame would skip narrowing to a stack without the
            # inner one (the budget pays for these walks)
            user, self._user_depth = innermost_user_frame(0)
            key = frame_key(user)
            stack = user_stack_of(sys._getframe(1))
            frames = stack
            if self._marks_skipped:
                frames = tuple(frame for frame in stack if frame in self._previous_stack)
            self._previous_stack, self._marks_skipped = set(stack), False
            self._keys_seen.clear()
            if key is not None:
                self._keys_seen.add(key)
            del user
            self._observe_memory(frames)
            self._mark_budget.spend(time.perf_counter() - started)

    def _observe_memory(self, user_stack: tuple[Frame, ...]) -> None:
        step = self._step()
        if self._statm is not None:
            self._ledger("rss").observe(resident_bytes(self._statm), user_stack, step)
        heap = heap_bytes()  # where kept memory was allocated (nsadiag.probes.heap)
        if heap is not None:
            self._ledger("heap").observe(heap, user_stack, step)
        allocated = cuda_allocated()
        if allocated is not None:
            self._ledger("cuda").observe(allocated, user_stack, step)

    def _ledger(self, kind: str) -> MemoryLedger:
        """The ledger of ``kind``, made at its first reading only (the marks read at every
        step)."""
        ledger = self.book.memory.get(kind)
        if ledger is None:
            ledger = self.book.memory[kind] = MemoryLedger()
        return ledger

    def _work(self) -> tuple[int, ...]:
        calls, nodes = self._counters.snapshot() if self._counters else (0, 0)
        return calls, nodes, self._events()

    def _loop_state(self, t: float, user: list[FrameType], phase: str | None,
                    module: str | None) -> tuple[tuple[str, int], ...]:
        """Integer locals of the innermost user frame and of every user frame read before
        that is still on the stack (an outer loop is followed while inner code runs), read
        from the frames' memory (nsadiag.probes.framemem), never through ``f_locals``."""
        if not user or self._frames is None:
            return ()
        read = [f for f in user if f is user[0] or id(f) in self._watched_frames]
        self._watched_frames = {id(f) for f in read}
        values: list[tuple[str, int]] = []
        reader_ = self._frames
        for frame in read:
            ints = reader_.int_names(frame, MAX_LOCALS)
            code = frame.f_code
            self.book.see_locals(t, (code.co_name, code.co_filename, frame.f_lineno or 0),
                                 ints, functools.partial(reader_.range_end, frame), phase,
                                 module)
            values += sorted(ints.items())
        return tuple(values)

    def _compiled_since_pulse(self, cpu_s: float) -> bool:
        """Whether a compile of the main thread did work since the previous pulse (see
        the module docstring); the first pulse of a compile has nothing to compare."""
        started = self._compile_started
        if self._compiler is None or started is None:
            return False
        work = cpu_s + descendants_cpu_s()
        previous, self._compile_work = self._compile_work, work
        return previous is not None and work - previous >= COMPILE_WORK_S and \
            time.monotonic() - started <= COMPILE_BOUND_S

    def _pulse(self) -> None:
        counters = self._counters
        cpu_s, wait_s = self._clock.read()
        if self._compiled_since_pulse(cpu_s):
            self._progress_since_pulse = True
            self._last_progress = time.monotonic()
        compiler, started = self._compiler, self._compile_started
        self._emit({"progress": self._progress_since_pulse,
                    "idle_s": round(time.monotonic() - self._last_progress, 3),
                    "frame": self._last_user_frame, "cpu_s": round(cpu_s, 3),
                    "runq_s": round(wait_s, 3),
                    "calls": counters.calls if counters else None,
                    "nodes": counters.nodes if counters else None,
                    "op": counters.op if counters else None,
                    "samples": self.book.samples,
                    "compiling_s": round(time.monotonic() - started, 1)
                    if compiler is not None and started is not None else None,
                    "compiler": f"{compiler[0]} ({compiler[1]}:{compiler[2]})"
                    if compiler is not None else None})
        self._progress_since_pulse = False


def iter_pulses(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pulse events among heartbeat events."""
    return [e for e in events if e.get("kind") == "pulse"]
