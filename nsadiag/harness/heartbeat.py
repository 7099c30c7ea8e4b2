"""Heartbeat events: JSON lines, one per event, flushed as written, so a watching parent sees
progress *inside* a step (which block, which branch, forward or backward).

Every line has, in this order:
    t              unix time (float seconds)
    seq            0, 1, 2, ... (+1 per event of this file)
    kind           "start" | "module" | "step" | "end" | "pulse" | "collective" | "compile"
    phase          "build" | "forward" | "backward" | "optimizer"
    step           0-based step index
    module, edge   module events only: dotted module name, "enter" | "exit"
    edges          module events of a watched user process only (``write_blocks``): the
                   block enters this event stands for, itself included
    rss            resident bytes of this process (/proc/self/statm); a watched user
                   process's module events carry the reading of the event before them,
                   and its step events null but every STEP_READING_S
    cuda_alloc     torch.cuda.memory_allocated(), null while CUDA is not initialised
                   and where rss is
    cuda_reserved  torch.cuda.memory_reserved(), null likewise
"start" marks the beginning of a phase: "build" once (with the process's pid, and its rank
under torchrun), then "forward", "backward", "optimizer" of every step (in a watched user
process only those after PHASE_EVENT_QUIET_S without one: ``enter_phase``); the "backward"
start of step 0 carries saved_bytes and
saved_by_branch (what its forward saved for backward, so a trial killed later still has
them). "step" (phase "optimizer") closes a finished step and carries
step_s, forward_s, backward_s. "end" carries status ("ok" | "error"). "pulse" events
come from the progress sampler (nsadiag.probes.sampler: progress, idle_s, frame, cpu_s,
runq_s, calls, nodes, op, samples); "collective" events from the collective counter of a
rank (nsadiag.harness.collectives); "compile" events each compile torch.compile finished
in a watched user process (nsadiag.probes.recompiles: compile_id, function, file, line,
recompile_reason).

For module events, phase is the pass the hook belongs to: forward hooks write "forward",
backward hooks write "backward". Forward events inside a step's backward phase are
gradient-checkpoint recomputation; their forward exit may be missing, because
non-reentrant checkpointing stops the recompute as soon as the saved tensors are rebuilt.

A watched user process (nsadiag.harness.watched) counts its blocks' enters in memory,
where its block hooks keep them (``count_blocks``: the enters so far and the block entered
last), and ``write_blocks`` turns what was counted since the last "module" event into one
event, the latest block with ``edges`` for all the enters it stands for: the progress
sampler calls it at every sample (ten a second, far more often than the watcher polls, so
the stall clock sees a progressing model), and every phase start, step and end calls it
first, so the events of a phase stand for all its enters (a watched process's step ends
are kept and written later, STEP_READING_S: its enters may follow them). The block hook itself only
counts (no clock read, no call); the file is flushed at most every FLUSH_S or when any
other event is written (a pulse, a step, a collective: the sampler pulses every second, so
nothing waits longer than that to be read, and a process that aborts leaves every event
but the latest block counts). A model of many small blocks would otherwise pay a JSON
line and a write per block call (17 % of its step; bench/bench_overhead.py).

No write lets the GIL go: the events are written with the GIL held (``write_all``, ``read_at``
for the resident memory; a regular file's write lands in the page cache at once). The
model's thread writes its phase starts (and a trial's steps), the sampler's thread its block
events, pulses and a watched process's step ends; a write that let the GIL go inside the
writer's lock would hand the GIL to the sampler, which then waits for the lock and hands it
back: each such write cost the model's thread two waits for the GIL, and on a loaded
machine two waits for a core (bench/bench_gil_handoffs.py). For the same reason the
sampler's block event is skipped, not waited for, while the model's thread holds the lock
(``write_blocks(wait=False)``): the model's own next event writes those enters.

Hooks never synchronise the GPU: the CUDA numbers are allocator counters read on the host.
This module does not import torch itself, so a trial can write its first "start" event
before the seconds-long torch import (the parent sees the child alive and building).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsadiag.harness.slot import SlotWriter
from nsadiag.probes.framemem import read_at, write_all

if TYPE_CHECKING:
    from torch import nn

    from nsadiag.targets import BranchProbe, Emit, Record, Target

_PAGE = os.sysconf("SC_PAGE_SIZE")
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
"""One encoder for every event: json.dumps with separators builds a new one per call, half
the cost of writing an event."""
FLUSH_S = 0.05
"""A buffered writer (``buffered=True``) flushes at most this often, and at every pulse."""
PHASE_EVENT_QUIET_S = 0.05
"""A watched user process writes a phase's "start" event (``enter_phase``) only when no
phase start or step event was written for this long. Each event costs the model's thread
20 to 40 us (an encoding, a read of its resident memory, a write): two phase starts a step
were 1 to 1.5 % of a step of 7 ms (bench/gil_loop.py). A step of 50 ms or more keeps all
its events; a faster loop writes every step event, and its phases reach the file through
the pulses (every second) and the next event, which is as fast as the watcher reads them.
A chosen gap, FLUSH_S, the module events' own."""
STEP_READING_S = 0.05
"""A watched user process reads its resident (and CUDA) memory at a step's end only when
the last such reading is this old; its other step events carry none. A step event written
on the model's thread cost it 130 to 170 us inside a loop of 8 ms steps (a block event, a
read of /proc/self/statm, an encoding and a write, each from cold caches: ten times what
the same calls take in a loop of their own), 1.6 to 1.8 % of the step (bench/gil_loop.py).
So a watched process's step ends are kept in memory (``step_done``: a clock read and an
append, and this reading when due) and written by the next event of any kind or by the
sampler's next tick, within a tenth of a second. A step of 50 ms or more keeps every
reading; a faster loop's growth per step is fitted from readings at step ends 50 ms apart
(20 a second). FLUSH_S's gap, the module events' own."""
THIN_BURST_BYTES = 4 * 2**20
THIN_RATE_BYTES_S = 350.0
THIN_EVERY_S = 2.0
"""A watched user process's heartbeat is bounded over days: it writes as it comes until
THIN_BURST_BYTES are spent, and from then on what its budget refills (THIN_RATE_BYTES_S, a
token bucket) decides. Once thinned, step ends and block enters are written at most every
THIN_EVERY_S, each step event for the steps since the last one (``steps``: their number,
the latest step's times, the memory read when it is written) and each block event for
every enter since (``edges``), so the counts stay whole; pulses (every second), phase
starts, collectives, compiles and the end are always written. A loop of 1 ms steps wrote
240 to 620 KB/s before (20 to 50 GB a day); thinned, a pulse (about 300 bytes) a second
and a step and a block event every two seconds come to about 550 B/s, 48 MB a day, 2 MB
an hour: the stall clock still sees progress every second. A trial child (not buffered)
writes every event: its steps are few and long."""


class HeartbeatWriter:
    """Writes flushed JSONL events to `path` (truncated on open). Thread-safe: CUDA
    backward hooks run on autograd's worker thread, pulses on the sampler's thread.

    ``rank`` (under torchrun) is written into collective events. ``context()`` is what the
    process is doing now, for the sampler: the phase and the innermost watched module
    whose forward or backward has entered and not exited.

    A write that fails (a full disk) never raises into the watched code: events stop being
    appended, ``lost`` says from where, and they go to the slot beside the file
    (nsadiag.harness.slot), where the watcher still reads the progress and the counts."""

    def __init__(self, path: str | Path, rank: int | None = None, buffered: bool = False):
        """``buffered``: module events flushed at most every FLUSH_S, not at every
        event (a watched user process: see the module docstring)."""
        self.path = Path(path)
        self.buffered = buffered
        # time.monotonic() of the last flush, "start" or "step" event and memory reading at
        # a step end: -inf before the first (monotonic time starts at boot, and a machine
        # up for less than an hour would otherwise take a start for one an hour old)
        self._flushed = self._phase_written = self._step_read = float("-inf")
        # a buffered writer's step ends (``step_done``), written ahead of the next event:
        # (t, step, (rss, cuda_alloc, cuda_reserved), step_s, forward_s, backward_s, measured)
        self._kept_steps: list[tuple[float, int, tuple[int | None, int | None, int | None],
                                     float, float, float, dict[str, Any]]] = []
        self._last_rss: int | None = None  # the resident bytes of the latest event
        # a watched process's block enters (count_blocks): (enters so far, block entered
        # last), the enters the module events written stand for, the enters at phase start
        self._entered: Callable[[], tuple[int, str | None]] | None = None
        self._enters_written = 0
        self._enters_at_phase = 0
        self.rank = rank
        # closed in close(); written with the GIL held (see the module docstring)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC |
                                       os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._pending: list[tuple[str, bytes]] = []  # (kind, encoded event) not written yet
        # the budget of a buffered writer (THIN_BURST_BYTES): bytes it may still write, and
        # when it was last refilled; when steps and blocks were last written once thinned
        self._tokens, self._tokens_t = float(THIN_BURST_BYTES), time.monotonic()
        self._steps_thinned_t = self._blocks_thinned_t = float("-inf")
        self.thinned_at: float | None = None  # time.time() when the budget first ran out
        self._file_bytes = 0  # what the file holds of whole writes (cut back to on a failure)
        # where events go once the disk is full (a regular heartbeat file's only)
        self.slot = SlotWriter(self.path if stat.S_ISREG(os.fstat(self._fd).st_mode)
                               else None)
        self._statm = os.open(f"/proc/{os.getpid()}/statm", os.O_RDONLY)
        # reentrant: a phase start writes the block event and its own under one hold, so
        # the sampler's block event never falls between them
        self._lock = threading.RLock()
        self._seq = 0
        self.phase = "build"
        self.step = 0
        self.module_events = 0
        self.events = 0  # every event but pulses: the sampler counts these as progress
        self.watched_blocks: int | None = None  # blocks of the last model hook_modules() hooked
        self._open: list[str] = []
        self.lost: str | None = None  # why events stopped being written (a full disk)

    def start(self, phase: str, step: int = 0, **extra: Any) -> None:
        """Enter `phase` of `step` and write a "start" event (with `extra` fields)."""
        with self._lock:
            self.write_blocks()
            self._enter(phase, step)
            self._write("start", phase, **extra)

    def enter_phase(self, phase: str, step: int, quiet_s: float = PHASE_EVENT_QUIET_S) -> None:
        """Enter ``phase`` of ``step`` as ``start`` does, writing its "start" event only
        when no phase start or step was written for ``quiet_s`` (see PHASE_EVENT_QUIET_S);
        otherwise the phase changes in memory, where pulses and the next event read it."""
        with self._lock:
            if time.monotonic() - self._phase_written >= quiet_s:
                self.start(phase, step)
            else:
                self._enter(phase, step)

    def _enter(self, phase: str, step: int) -> None:
        """The phase and step now (under the lock): no module is open in it, and the block
        enters counted so far belong to the phases before it."""
        self.phase, self.step = phase, step
        self._open.clear()
        if self._entered is not None:
            self._enters_at_phase = self._entered()[0]

    def module(self, name: str, phase: str, edge: str) -> None:
        """A module (or branch) hook fired: `phase` is its pass, `edge` enter or exit."""
        if edge == "enter":
            self._open.append(name)
        elif name in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(name)]
        self._write("module", phase, module=name, edge=edge)

    def count_blocks(self, entered: Callable[[], tuple[int, str | None]]) -> None:
        """Block enters are counted outside the writer (a watched process's block hooks):
        ``entered()`` gives the enters so far and the block entered last (blocks are
        siblings: the one entered last is the one running). See the module docstring."""
        with self._lock:
            self._entered = entered
            self._enters_written = self._enters_at_phase = entered()[0]

    def write_blocks(self, wait: bool = True) -> bool:
        """The "module" event for the block enters counted and not written yet, if any
        (see the module docstring); from the sampler's thread and the model's alike.
        Without ``wait`` nothing is written while another thread holds the writer (its
        next event writes them): False then. The step events kept in memory are written
        too, ahead of it (``step_done``)."""
        if self._entered is None and not self._kept_steps:
            return True
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            enters, block = self._entered() if self._entered is not None else (0, None)
            if enters > self._enters_written and block is not None and self._blocks_due():
                edges, self._enters_written = enters - self._enters_written, enters
                self._write("module", self.phase, module=block, edge="enter", edges=edges)
            elif self._kept_steps and self._steps_due():
                self._write_kept_steps()
            return True
        finally:
            self._lock.release()

    def context(self) -> tuple[str | None, str | None]:
        """(phase, innermost open module) right now: for counted blocks, the block entered
        last in this phase."""
        if self._entered is not None:
            enters, block = self._entered()
            return self.phase, (block if enters > self._enters_at_phase else None)
        open_ = self._open
        return self.phase, (open_[-1] if open_ else None)

    def pulse(self, fields: dict[str, Any]) -> None:
        """A progress pulse from the sampler (not counted as an event of the run)."""
        self._write("pulse", self.phase, **fields)

    def compiled(self, fields: dict[str, Any]) -> None:
        """A compile torch.compile finished (nsadiag.probes.recompiles): compiling is
        progress, and a recompile carries the guard that failed."""
        self._write("compile", self.phase, **fields)

    def collective(self, edge: str, n: int, op: str, origin: str, detail: str,
                   shapes: list[list[int]], status: str | None = None,
                   nbytes: int | None = None) -> None:
        """A collective of this rank started or ended (nsadiag.harness.collectives)."""
        extra: dict[str, Any] = {"edge": edge, "n": n, "op": op, "origin": origin,
                                 "detail": detail, "shapes": shapes, "rank": self.rank}
        if status is not None:
            extra["status"] = status
        if nbytes is not None:
            extra["bytes"] = nbytes
        self._write("collective", self.phase, **extra)

    def step_done(self, step_s: float, forward_s: float, backward_s: float,
                  **measured: Any) -> None:
        """Step `self.step` finished (after the optimizer); ``measured`` adds fields such
        as the step's FLOPs and efficiency. A buffered writer keeps the event in memory,
        with the time the step ended and, every STEP_READING_S, the memory then: it is
        written ahead of the next event, or by the sampler's next ``write_blocks``."""
        if not self.buffered:
            with self._lock:
                self.write_blocks()
                self._write("step", "optimizer", step_s=step_s, forward_s=forward_s,
                            backward_s=backward_s, **measured)
            return
        now = time.monotonic()
        memory: tuple[int | None, int | None, int | None] = (None, None, None)
        if now - self._step_read >= STEP_READING_S:
            self._step_read = now
            rss = self._last_rss = self._rss()
            memory = (rss, *_cuda_memory())
        with self._lock:
            self._kept_steps.append((time.time(), self.step, memory, step_s, forward_s,
                                     backward_s, measured))
            self.events += 1  # progress now, for the sampler, as a written step is
            self._phase_written = now

    def end(self, status: str) -> None:
        """The trial is over; status "ok" or "error"."""
        with self._lock:
            self.write_blocks()
            self._write("end", self.phase, status=status)

    def close(self) -> None:
        with self._lock:
            if self._fd is None:
                return
            if self._kept_steps:
                self._write_kept_steps(force=True)
            self._flush()
            self.slot.close()
            os.close(self._fd)
            self._fd = None
            os.close(self._statm)

    def _flush(self) -> None:
        """Write the pending events (under the lock). A write the disk refuses is cut back
        to the last whole one and the events go to the slot from then on (``_lose``)."""
        if not self._pending or self._fd is None:
            return
        batch, self._pending = self._pending, []
        data = b"".join(line for _, line in batch)
        try:
            write_all(self._fd, data)
        except OSError as err:  # a full disk: the watched process must not fail by us
            self._lose(err, batch)
            return
        self._file_bytes += len(data)
        self._tokens -= len(data)

    def _lose(self, err: OSError, batch: list[tuple[str, bytes]]) -> None:
        """The file refused ``batch``: no part of it stays in the file (a torn line would be
        read as nothing, its whole events as written twice), and it and every later event
        go to the slot (nsadiag.harness.slot), where the watcher reads them."""
        first = self._seq - len(batch)
        self.lost = f"events after #{first - 1} not written: {err.strerror or err}"
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self._file_bytes)  # type: ignore[arg-type]
        self.slot.lose(self.lost, batch)

    def _write(self, kind: str, phase: str, **extra: Any) -> None:
        event: dict[str, Any] = {"t": 0.0, "seq": 0, "kind": kind, "phase": phase,
                                 "step": self.step}
        if "module" in extra:
            event["module"] = extra.pop("module")
            event["edge"] = extra.pop("edge")
        # a buffered writer's module events (the block counts, written at every sample and
        # phase) carry the resident memory of the event before them: each read is a
        # system call the model's thread pays for, and only step ends are fitted
        reuse = self.buffered and kind == "module" and self._last_rss is not None
        event["rss"] = self._last_rss if reuse else self._rss()
        self._last_rss = event["rss"]
        event["cuda_alloc"], event["cuda_reserved"] = _cuda_memory()
        event.update(extra)
        with self._lock:
            # every step kept before the end is written with it, thinned or not
            kept = bool(self._kept_steps) and (kind == "end" or self._steps_due())
            if kept:
                self._write_kept_steps(flush=False, force=kind == "end")
            event["t"], event["seq"] = time.time(), self._seq
            self._seq += 1
            if kind == "module":
                self.module_events += 1
            if kind != "pulse":
                self.events += 1
            if kind in ("start", "step"):
                self._phase_written = time.monotonic()
            if self._fd is None:  # closed: at exit, a late pulse
                raise ValueError("the heartbeat is closed")
            line = (_ENCODE(event) + "\n").encode()
            if self.lost is not None:
                self.slot.add(kind, line, int(event.get("steps") or 1))
                return
            self._pending.append((kind, line))
            now = time.monotonic()
            # only module events wait for a flush: they are the many; a collective, a
            # step or a pulse is written through, so a rank that aborts right after it
            # (gloo on a collective mismatch) leaves it for the verdict
            if not self.buffered or kind != "module" or kept or \
                    now - self._flushed >= FLUSH_S:
                self._flush()
                self._flushed = now

    def _write_kept_steps(self, flush: bool = True, force: bool = False) -> None:
        """The step events kept in memory (``step_done``), in order, under the lock; each
        was counted in ``events`` when kept. Without ``flush`` the caller flushes. Once
        thinned (THIN_BURST_BYTES) they are one event, the latest step's, standing for
        them all (``steps``), with the memory read now."""
        kept, self._kept_steps = self._kept_steps, []
        if self._fd is None or not kept:
            return
        if self._thinned():
            t, step, _, step_s, forward_s, backward_s, measured = kept[-1]
            rss = self._last_rss = self._rss()
            kept = [(t, step, (rss, *_cuda_memory()), step_s, forward_s, backward_s,
                     {**measured, "steps": len(kept)})]
            self._steps_thinned_t = time.monotonic()
        for t, step, (rss, alloc, reserved), step_s, forward_s, backward_s, measured in kept:
            event = {"t": t, "seq": self._seq, "kind": "step", "phase": "optimizer",
                     "step": step, "rss": rss, "cuda_alloc": alloc,
                     "cuda_reserved": reserved, "step_s": step_s, "forward_s": forward_s,
                     "backward_s": backward_s, **measured}
            self._seq += 1
            line = (_ENCODE(event) + "\n").encode()
            if self.lost is not None:
                self.slot.add("step", line, int(measured.get("steps") or 1))
            else:
                self._pending.append(("step", line))
        if flush:
            self._flush()
            self._flushed = time.monotonic()

    def _thinned(self) -> bool:
        """Whether a buffered writer has spent its budget (THIN_BURST_BYTES; refilled at
        THIN_RATE_BYTES_S), under the lock."""
        if not self.buffered:
            return False
        now = time.monotonic()
        self._tokens = min(float(THIN_BURST_BYTES),
                           self._tokens + (now - self._tokens_t) * THIN_RATE_BYTES_S)
        self._tokens_t = now
        if self._tokens > 0:
            return False
        if self.thinned_at is None:
            self.thinned_at = time.time()
        return True

    def _steps_due(self) -> bool:
        """Whether the kept step ends may be written now (always, until thinned)."""
        return not self._thinned() or \
            time.monotonic() - self._steps_thinned_t >= THIN_EVERY_S

    def _blocks_due(self) -> bool:
        """Whether a block event may be written now (always, until thinned); the enters
        not written stay counted for the next one."""
        if not self._thinned():
            return True
        now = time.monotonic()
        if now - self._blocks_thinned_t < THIN_EVERY_S:
            return False
        self._blocks_thinned_t = now
        return True

    def _rss(self) -> int:
        fields = (read_at(self._statm, 128, 0, partial=True) or b"0 0").split()
        return int(fields[1]) * _PAGE


class OpenBackward:
    """Follows heartbeat events: which modules' backward started in the current backward
    phase and has not finished. A "start" event of phase "backward" begins a new phase;
    module events of phase "backward" open ("enter") and close ("exit") a module."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}  # module -> seq of its backward enter

    def add(self, event: dict[str, Any]) -> None:
        kind, phase = event.get("kind"), event.get("phase")
        if kind == "start" and phase == "backward":
            self._open.clear()
        elif kind == "module" and phase == "backward":
            if event.get("edge") == "enter":
                self._open[event["module"]] = event.get("seq", 0)
            else:
                self._open.pop(event["module"], None)

    def modules(self) -> list[str]:
        """Open modules, the latest started (innermost) first."""
        return [name for name, _ in sorted(self._open.items(), key=lambda item: -item[1])]


def unfinished_backward(events: list[dict[str, Any]]) -> list[str]:
    """Modules whose backward started in the last backward phase of `events` (heartbeat
    events, oldest first) and never finished, innermost first."""
    tracker = OpenBackward()
    for event in events:
        tracker.add(event)
    return tracker.modules()


def loaded_torch() -> Any:
    """The torch module if something has imported it already, else None."""
    return sys.modules.get("torch")


def _cuda_memory() -> tuple[int | None, int | None]:
    torch = loaded_torch()
    cuda = getattr(torch, "cuda", None)  # None while torch is still being imported
    try:
        if cuda is None or not cuda.is_initialized():
            return None, None
        return cuda.memory_allocated(), cuda.memory_reserved()
    except (AttributeError, RuntimeError):
        return None, None


class ModuleHooks:
    """Hooks installed by `hook_modules`; use as a context manager or call `remove()`."""

    def __init__(self, handles: list[Any], probe: BranchProbe | None):
        self._handles = handles
        self._probe = probe

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._probe is not None:
            self._probe.remove()
            self._probe = None

    def __enter__(self) -> ModuleHooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def hook_modules(target: Target, writer: HeartbeatWriter, branch_emit: Emit | None = None,
          record: Record | None = None) -> ModuleHooks:
    """Emit module events for every block (forward pre/post, full backward pre/post hooks)
    and for every NSA branch (see nsadiag.targets.BranchProbe). Branch events go to
    `branch_emit` when given (which must pass them on to writer.module), so another probe
    can follow the same branch wrappers instead of installing its own; `record` also
    receives each branch's output (see nsadiag.targets.instrument_branches)."""
    from nsadiag.targets import instrument_branches

    handles = []
    for name, block in target.blocks:
        handles += _hook_block(name, block, writer)
    writer.watched_blocks = len(target.blocks)
    return ModuleHooks(handles, instrument_branches(target, branch_emit or writer.module, record))


def _hook_block(name: str, block: nn.Module, writer: HeartbeatWriter) -> list[Any]:
    def forward_enter(module: nn.Module, args: Any) -> None:
        writer.module(name, "forward", "enter")

    def forward_exit(module: nn.Module, args: Any, output: Any) -> None:
        writer.module(name, "forward", "exit")

    def backward_enter(module: nn.Module, grad_output: Any) -> None:
        writer.module(name, "backward", "enter")

    def backward_exit(module: nn.Module, grad_input: Any, grad_output: Any) -> None:
        writer.module(name, "backward", "exit")

    return [block.register_forward_pre_hook(forward_enter),
            block.register_forward_hook(forward_exit),
            block.register_full_backward_pre_hook(backward_enter),
            block.register_full_backward_hook(backward_exit)]
