"""What the machine gives a job: its load, its CPU time (steal included), the kernel's OOM
kills, and the CPU time of each watched process's main thread.

A verdict on a busy machine must not blame the job for the machine: every watch records
the load at its start and end (``machine_load``) and each main thread's on-CPU and
run-queue time over the job's life (``MainThreadClocks``). nsadiag.verdict.load reads them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def main_thread_clock(pid: int) -> tuple[float, float] | None:
    """(on-CPU, run-queue) seconds of the main thread of ``pid`` so far, from
    /proc/PID/task/PID/schedstat; None when unreadable (the process is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as handle:
            run_ns, wait_ns, _ = handle.read().split()
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def cpu_stat(path: Path = Path("/proc/stat")) -> dict[str, int | None] | None:
    """The machine's cumulative CPU time in jiffies: {"total", "steal"} from the first
    line of /proc/stat (steal None where the kernel has no steal column); None when
    unreadable. Two readings give the share of CPU time a hypervisor stole between them."""
    try:
        with open(path) as handle:
            fields = handle.readline().split()
        values = [int(x) for x in fields[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is
    # already counted in user and nice
    return {"total": sum(values[:8]), "steal": values[7] if len(values) > 7 else None}


def machine_load() -> dict[str, Any]:
    """Load averages, usable CPUs and the cumulative CPU times (with steal) now."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        one = five = fifteen = None
    return {"loadavg": [one, five, fifteen], "cpus": len(os.sched_getaffinity(0)),
            "cpu_stat": cpu_stat()}


def cgroup_oom_kills(path: Path = Path("/sys/fs/cgroup/memory.events")) -> int | None:
    """The cgroup's count of kernel OOM kills (cgroup v2), None when unreadable."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


class MainThreadClocks:
    """The first and the latest (monotonic time, on-CPU s, run-queue s) reading of every
    watched process's main thread, by name."""

    def __init__(self) -> None:
        self.readings: dict[str, list[tuple[float, float, float]]] = {}

    def read(self, pids: Mapping[str, int | None]) -> None:
        """Read the main thread of each process in {name: pid} (None: not known yet)."""
        for name, pid in pids.items():
            clock = main_thread_clock(pid) if pid else None
            if clock is not None:
                reading = (time.monotonic(), *clock)
                self.readings.setdefault(name, [reading, reading])[1] = reading

    def load(self, before: dict[str, Any]) -> dict[str, Any]:
        """The machine's load at start (``before``) and now, and each main thread's CPU
        use over its life: share (on-CPU / wall), demand ((on-CPU + run-queue) / wall) and
        got (on-CPU / (on-CPU + run-queue): how much of the CPU it asked for it received)."""
        use = {}
        for name, (start, end) in self.readings.items():
            wall_s = end[0] - start[0]
            if wall_s <= 0:
                continue
            cpu, runq = end[1] - start[1], end[2] - start[2]
            use[name] = {"wall_s": wall_s, "cpu_s": cpu, "runq_s": runq,
                         "cpu_share": cpu / wall_s, "demand": (cpu + runq) / wall_s,
                         "got": cpu / (cpu + runq) if cpu + runq > 0 else None}
        return {"start": before, "end": machine_load(), "main_thread": use}
