"""Forked workers that copy what they were forked with: copy-on-read, found in the memory
of every process (nsadiag.record.process_memory).

A forked child starts with every page of its parent shared. Reading a Python object
writes its reference count, so each page of Python objects a worker reads is copied into
it: its private memory (Private_Dirty) grows while the memory it shares with its parent
(Shared_Dirty) falls by about as much. ``copy_on_read(memory, message)`` finds the forked
children whose private memory grew by ``MIN_GROWTH_BYTES`` or more while their shared
memory fell by at least ``SHARED_FALL_SHARE`` of that growth (a worker that allocates
its own memory grows without its shared pages falling), with the dataset container
their parent's fork note names (nsadiag.probes.forks), and which of them was killed (its
pid in the exception that ended the run: "DataLoader worker (pid 123) is killed by
signal"). Every sentence here quotes those measurements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from nsadiag.finding import Culprit
from nsadiag.finding.numbers import count, sig, size
from nsadiag.record.process_memory import (
    DatasetContainer,
    ForkedDataset,
    ProcessMemory,
    ProcessSeries,
)

MIN_GROWTH_BYTES = 32 * 2**20
SHARED_FALL_SHARE = 0.5
KILLED_WORDS = re.compile(r"killed|exited unexpectedly|signal", re.IGNORECASE)


@dataclass(frozen=True)
class CopyingWorker:
    """One forked child whose private memory grew as its shared memory fell: its series,
    the private and shared bytes at its first reading and at its private peak, and the
    seconds between."""

    series: ProcessSeries
    private_from: int
    private_to: int
    shared_from: int
    shared_to: int
    seconds: float

    @property
    def name(self) -> str:
        kind = "DataLoader worker" if self.series.dataset is not None else "forked child"
        return f"{kind} pid {self.series.pid}"

    def sentence(self) -> str:
        parent = f" with pid {self.series.forked_by}" if self.series.forked_by else ""
        return (f"{self.name}: private memory {size(self.private_from)} -> "
                f"{size(self.private_to)} in {sig(self.seconds)} s while the memory it "
                f"shares{parent} fell {size(self.shared_from)} -> {size(self.shared_to)}")


@dataclass(frozen=True)
class CopyOnRead:
    """The copying workers (largest growth first), the dataset they were forked with and
    its largest container of Python objects (None when no DataLoader noted one), and the
    pid of the worker the run's exception says was killed (None when none)."""

    workers: tuple[CopyingWorker, ...]
    dataset: ForkedDataset | None
    container: DatasetContainer | None
    killed: int | None

    @property
    def what_failed(self) -> bool:
        return self.killed is not None

    def attribute(self) -> str | None:
        """"`TextRecords.records` (a list of 600,000 dict, about 290 MiB of Python
        objects)", None when no container was named."""
        if self.container is None or self.dataset is None:
            return None
        c = self.container
        return (f"`{self.dataset.class_name}.{c.path}` (a {c.type} of {count(c.length)} "
                f"{c.item_type}, about {size(c.estimated_bytes)} of Python objects)")

    def culprit(self, display_path: str | None) -> Culprit | None:
        """The line that assigns the container, None when it was not found."""
        c = self.container
        if c is None or c.line is None or self.dataset is None or not self.dataset.file:
            return None
        return Culprit(display_path or Path(self.dataset.file).name, c.line,
                       f"holds {count(c.length)} Python objects ({c.item_type}) that the "
                       f"forked DataLoader workers copy page by page as they read them",
                       code=c.code)

    def proof(self) -> str:
        # the worker that was killed, else the one that grew most
        worst = next((w for w in self.workers if w.series.pid == self.killed),
                     self.workers[0])
        killed = " before it was killed" if worst.series.pid == self.killed else ""
        return (f"{worst.sentence()}{killed}: the pages it was forked with are copied into "
                f"it as it reads them (copy-on-read)")

    def cause(self) -> str:
        attribute = self.attribute()
        held = f"; what they read is {attribute}" if attribute else \
            "; what they read was not named (no DataLoader's dataset was noted at the fork)"
        many = f"{len(self.workers)} forked workers" if len(self.workers) > 1 else \
            "a forked worker"
        return (f"copy-on-read: {many} copied the Python objects they read from their "
                f"parent (each read writes the object's reference count, and the kernel "
                f"copies its page){held}")

    def next_action(self) -> str:
        c = self.container
        if c is not None:
            return (f"Hold `{c.path}` without a Python object per item: one numpy array "
                    f"per field (or a tensor), or one bytes buffer with an array of "
                    f"offsets, and build each item in `__getitem__`; or load it in each "
                    f"worker (`worker_init_fn`) rather than before the DataLoader forks. "
                    f"Then every worker reads the shared pages without copying them.")
        return ("Keep what the forked workers read out of Python objects (numpy arrays, "
                "tensors or one bytes buffer), or create it in each worker after the fork: "
                "every Python object a worker reads has its page copied into it.")


def _copying(series: ProcessSeries) -> CopyingWorker | None:
    if series.forked_by is None or len(series.points) < 2:
        return None
    first = series.points[0]
    top = max(series.points, key=lambda p: p.private)
    grew = top.private - first.private
    fell = first.shared - top.shared
    if grew < MIN_GROWTH_BYTES or fell < SHARED_FALL_SHARE * grew:
        return None
    return CopyingWorker(series, first.private, top.private, first.shared, top.shared,
                         top.t - first.t)


def _killed(workers: tuple[CopyingWorker, ...], message: str | None) -> int | None:
    if not message or not KILLED_WORDS.search(message):
        return None
    pids = {int(n) for n in re.findall(r"\b\d+\b", message)}
    return next((w.series.pid for w in workers if w.series.pid in pids), None)


def copy_on_read(memory: ProcessMemory | None, message: str | None = None
                 ) -> CopyOnRead | None:
    """The copy-on-read finding of a run's process memory (see the module docstring);
    ``message`` is the exception that ended the run, None when none did."""
    if memory is None:
        return None
    workers = tuple(sorted(filter(None, map(_copying, memory.series)),
                           key=lambda w: w.private_from - w.private_to))
    if not workers:
        return None
    dataset = next((w.series.dataset for w in workers if w.series.dataset is not None), None)
    container = dataset.containers[0] if dataset is not None and dataset.containers else None
    return CopyOnRead(workers, dataset, container, _killed(workers, message))
