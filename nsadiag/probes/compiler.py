"""Compiling is progress: whether a thread is inside torch.compile's compiler, and the CPU
time its helper processes use.

A compiling main thread often shows no progress the sampler can see: it waits for the
compile workers' futures, or for the C++ compiler it started, with the same stack for
seconds at a time (tens of seconds on a loaded machine), and no module call or autograd
node moves. The work happens in other processes. So while the main thread is in the
compiler, the sampler (nsadiag.probes.sampler) also counts as progress the CPU time that
the main thread or any process below this one used (compile workers, the C++ compiler),
for at most COMPILE_BOUND_S of one compile: a compile busier than that is reported as the
stall it then is, with the compiler's frame (nsadiag.verdict.compiling).

The compiler is recognised by its entry points, not by any torch frame: a compiled model
that runs keeps Dynamo's eval-frame wrappers on its stack, while Dynamo's frame conversion
(``torch/_dynamo/convert_frame.py``) and Inductor's graph compilation
(``torch/_inductor/compile_fx.py``, which the backward's lazy compile also goes through)
are on the stack only while compiling.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

COMPILER_FILE = re.compile(r"torch/_dynamo/convert_frame\.py$|torch/_inductor/compile_fx\.py$")
COMPILE_BOUND_S = 1200.0
"""The longest one compile's busy time counts as progress. A chosen bound, far above what
was measured: a compiled step that recompiles at every new sequence length took seconds per
compile on 2 loaded cores, a model's first compiled step about 40 s; models far larger
than these compile in minutes. Past it the stall clock runs again."""
COMPILE_WORK_S = 0.05
"""CPU seconds, summed over the main thread and the processes below, that count as compile
work between two pulses. A chosen floor: above the wake-ups of idle compile workers and of
the sampler itself (milliseconds a second), below any compile step (a C++ compile of one
kernel takes a second or more)."""
_TICK = os.sysconf("SC_CLK_TCK")


def compiler_frame(frames: Iterable[tuple[str, str, int]]) -> tuple[str, str, int] | None:
    """The outermost frame of ``frames`` (function, file, line; outermost first) that is an
    entry point of the compiler; None when the stack is not compiling."""
    for frame in frames:
        if COMPILER_FILE.search(frame[1]):
            return frame
    return None


def _stat_cpu_s(pid: int | str, reaped: bool) -> float:
    """utime + stime of a process (and, with ``reaped``, its waited-for children's)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICK


def _children(pid: int | str) -> list[str]:
    found: list[str] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += handle.read().split()
        except OSError:
            continue
    return found


def descendants_cpu_s(pid: int | None = None) -> float:
    """CPU seconds used by every process below ``pid`` (this process by default): the live
    ones' own and reaped children's time, and the children this process reaped (a C++
    compiler that ran and exited between two readings)."""
    root = os.getpid() if pid is None else pid
    total = _stat_cpu_s(root, reaped=True) - _stat_cpu_s(root, reaped=False)
    pending, seen = _children(root), set()
    while pending:
        child = pending.pop()
        if child in seen:
            continue
        seen.add(child)
        total += _stat_cpu_s(child, reaped=True)
        pending += _children(child)
    return total
