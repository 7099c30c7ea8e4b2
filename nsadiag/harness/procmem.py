"""Every process's private and shared memory, read from the parent while the job runs.

A forked DataLoader worker that copies its dataset page by page (nsadiag.probes.forks), a
worker that leaks, a launcher that holds a copy of everything: each shows only in that
process's own memory, which a heartbeat of the training process does not carry (a forked
worker writes none). ``MemoryWatch.sample(processes)`` reads ``/proc/PID/smaps_rollup`` of
every process of the job (Private_Dirty, Shared_Dirty, Anonymous, Swap, Rss): a new
process every ``YOUNG_INTERVAL_S`` for its first readings, then every ``MIN_INTERVAL_S``
or less often when reading costs more: the kernel walks a process's page tables to sum
them (about 20 ms for a 500 MB process here), so the spacing grows until reading takes at
most ``COST_SHARE`` of one CPU. What is kept is bounded: ``MAX_POINTS`` points per process
(every other one is dropped when full, the first kept) and ``MAX_SERIES`` processes (the
ended one whose memory changed least goes first, counted in ``left_out``).
``record(run_dir)`` is the typed record (nsadiag.record.process_memory), each forked child
joined with the note its watched parent left at the fork (its dataset's containers of
Python objects).
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterable
from pathlib import Path

import psutil

from nsadiag.probes.forks import read_notes
from nsadiag.record.process_memory import (
    WATCHED_INTERVAL_S,
    DatasetContainer,
    ForkedDataset,
    MemoryPoint,
    ProcessMemory,
    ProcessSeries,
)

MIN_INTERVAL_S = 1.0
YOUNG_INTERVAL_S = 0.5
"""A new process is looked for, and read for its first ``YOUNG_POINTS`` readings, this
often: a forked worker copies most of what it will copy in its first seconds."""
COST_SHARE = 0.02
"""Reading every process's smaps_rollup takes at most this share of one CPU."""
YOUNG_POINTS = 5
GROWING_BYTES = 2 * 2**20
"""A process whose private memory grew this much since its reading before is growing: it
is read again at the young spacing, as long as reading it alone takes at most
GROWING_COST_SHARE of one CPU (a worker that copies its dataset for twenty seconds is
watched while it copies, not once every spacing the quiet processes set)."""
GROWING_COST_SHARE = 0.1
MAX_POINTS = 240
MAX_SERIES = 48
ROLLUP = "/proc/{pid}/smaps_rollup"
FIELDS = {"Private_Dirty": "private", "Shared_Dirty": "shared", "Anonymous": "anonymous",
          "Swap": "swap", "Rss": "rss"}
COMMAND_CHARS = 80
SOURCE_BYTES = 4 * 1024 * 1024  # a dataset's file larger than this is not read for a line
CODE_CHARS = 160


def assigning_line(dataset: ForkedDataset, container: DatasetContainer
                   ) -> tuple[int, str] | None:
    """The line of the dataset's file that assigns the container's first attribute
    (``self.records = ...``, ``self.records: list = ...``): the first one from the
    class's ``__init__`` on, else the first in the file; None when the file cannot be read
    or has none."""
    if not dataset.file:
        return None
    try:
        path = Path(dataset.file)
        if path.stat().st_size > SOURCE_BYTES:
            return None
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    name = re.escape(container.path.split(".")[0])
    assigns = re.compile(rf"^\s*self\.{name}\s*(?::[^=]+)?=(?!=)")
    start = max(0, (dataset.line or 1) - 1)
    for number in [*range(start, len(lines)), *range(0, start)]:
        if assigns.match(lines[number]):
            return number + 1, lines[number].strip()[:CODE_CHARS]
    return None


def read_rollup(pid: int, t: float) -> MemoryPoint | None:
    """One point of ``pid`` from its smaps_rollup; None when it cannot be read (ended,
    not ours, or a kernel without the file)."""
    sizes = dict.fromkeys(FIELDS.values(), 0)
    try:
        with open(ROLLUP.format(pid=pid), encoding="ascii", errors="replace") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                key = FIELDS.get(name)
                if key is not None:
                    sizes[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return MemoryPoint(t=t, **sizes)


class _Series:
    def __init__(self, process: psutil.Process):
        self.pid = process.pid
        try:
            self.ppid: int | None = process.ppid()
            self.command = " ".join(process.cmdline())[:COMMAND_CHARS]
            self.started: float | None = process.create_time()
        except psutil.Error:
            self.ppid, self.command, self.started = None, "", None
        self.points: list[MemoryPoint] = []
        self.ended = False
        self.next_at = 0.0  # time.monotonic() of its next reading
        self.cost_s = 0.0  # what its last reading took

    def add(self, point: MemoryPoint) -> None:
        if len(self.points) >= MAX_POINTS:
            self.points = self.points[::2]
        self.points.append(point)

    def growing(self) -> bool:
        """Whether its private memory grew GROWING_BYTES or more at its latest reading."""
        return len(self.points) >= 2 and \
            self.points[-1].private - self.points[-2].private >= GROWING_BYTES

    def change(self) -> int:
        if not self.points:
            return 0
        first = self.points[0].private
        return max(abs(p.private - first) for p in self.points)


class MemoryWatch:
    """The job's processes' memory over time (see the module docstring). Each process has
    its own spacing: ``YOUNG_INTERVAL_S`` for its first ``YOUNG_POINTS`` readings (a
    worker that copies its parent does so in its first seconds), then ``MIN_INTERVAL_S``
    or as long as keeps the readings of all of them within ``COST_SHARE`` of one CPU."""

    def __init__(self) -> None:
        self.series: dict[int, _Series] = {}
        self.interval_s = MIN_INTERVAL_S
        self.next_at = 0.0
        self.read_s = 0.0
        self.left_out = 0
        self.unavailable: str | None = None if Path(ROLLUP.format(pid="self")).exists() \
            else "this kernel has no /proc/PID/smaps_rollup (Linux 4.14 or later has it)"

    def due(self) -> bool:
        return self.unavailable is None and time.monotonic() >= self.next_at

    def sample(self, processes: Iterable[psutil.Process], every: bool = False,
               watched: Collection[int] = ()) -> None:
        """Read each process whose reading is due (``every``: all of them, as at a stall);
        the caller calls it when ``due``. ``watched``: the pids that write a heartbeat,
        read every ``WATCHED_INTERVAL_S`` only."""
        if self.unavailable is not None:
            return
        now, wall = time.monotonic(), time.time()
        seen = set()
        for process in processes:
            series = self.series.get(process.pid)
            if series is not None and not every and now < series.next_at:
                seen.add(process.pid)
                continue
            began = time.perf_counter()
            point = read_rollup(process.pid, wall)
            cost = time.perf_counter() - began
            self.read_s += cost
            if point is None:
                continue
            seen.add(process.pid)
            if series is None:
                series = self.series[process.pid] = _Series(process)
            series.add(point)
            series.cost_s = cost
        for pid, series in self.series.items():
            series.ended = series.ended or pid not in seen
        alive = [s for s in self.series.values() if not s.ended]
        spacing = max(MIN_INTERVAL_S, sum(s.cost_s for s in alive) / COST_SHARE)
        for s in alive:
            if s.next_at <= now or every:
                s.next_at = now + (max(WATCHED_INTERVAL_S, spacing) if s.pid in watched else
                                   YOUNG_INTERVAL_S if len(s.points) < YOUNG_POINTS
                                   else max(YOUNG_INTERVAL_S, s.cost_s / GROWING_COST_SHARE)
                                   if s.growing() else spacing)
        self.interval_s = spacing
        self.next_at = min([s.next_at for s in alive] + [now + YOUNG_INTERVAL_S])
        self._bound()

    def _bound(self) -> None:
        while len(self.series) > MAX_SERIES:
            ended = [s for s in self.series.values() if s.ended]
            if not ended:
                return
            del self.series[min(ended, key=_Series.change).pid]
            self.left_out += 1

    def record(self, run_dir: Path) -> ProcessMemory:
        """The typed record, each forked child with its parent's fork note."""
        notes = {}
        for proc_dir in sorted(run_dir.glob("proc-*")):
            for note in read_notes(proc_dir):
                notes[note["pid"]] = note
        series = []
        for s in sorted(self.series.values(), key=lambda s: (s.started or 0.0, s.pid)):
            note = notes.get(s.pid) or {}
            dataset = note.get("dataset")
            try:
                forked_dataset = ForkedDataset.from_dict(dataset) if dataset else None
            except (TypeError, ValueError):
                forked_dataset = None  # a note the child could not finish is no evidence
            if forked_dataset is not None:
                forked_dataset = forked_dataset.with_lines(
                    lambda c, d=forked_dataset: assigning_line(d, c))
            ppid = note.get("ppid")
            series.append(ProcessSeries(
                pid=s.pid, ppid=s.ppid, command=s.command, started=s.started,
                points=tuple(s.points), ended=s.ended,
                forked_by=ppid if isinstance(ppid, int) else None, dataset=forked_dataset))
        return ProcessMemory(interval_s=round(self.interval_s, 3), series=tuple(series),
                             left_out=self.left_out, unavailable=self.unavailable,
                             read_s=self.read_s)
