"""Every process's private and shared memory over a run (nsadiag.harness.procmem).

``ProcessMemory`` is what the parent measured from each process's
``/proc/PID/smaps_rollup``: one ``ProcessSeries`` per process of the job (pid, parent pid,
its command's start, when it started, whether it had ended by the last look, what the
watched parent noted when it forked it: nsadiag.probes.forks) holding its
``MemoryPoint``s. A point's sizes are bytes: ``private`` is Private_Dirty (pages only
this process holds and has written: what forking does not share), ``shared`` is
Shared_Dirty (written pages it still shares with another process, its parent's after a
fork), ``anonymous``, ``swap`` and ``rss`` as the kernel counts them. The JSON form keeps
a point as a list ``[t, private, shared, anonymous, swap, rss]`` so a long run's record
stays small.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nsadiag.stored import NUMBER, optional

POINT_FIELDS = ("t", "private", "shared", "anonymous", "swap", "rss")
WATCHED_INTERVAL_S = 10.0
"""A process that writes a heartbeat (the training process, a rank) carries its resident
memory in it; its smaps_rollup is read this seldom: the kernel's walk of its page tables
holds its memory map's lock, which its own mmap and munmap (a large tensor's allocation
and its release) then wait for."""


@dataclass(frozen=True)
class MemoryPoint:
    t: float
    private: int
    shared: int
    anonymous: int
    swap: int
    rss: int

    def __post_init__(self) -> None:
        # the stored form keeps t to the millisecond: a live report and one re-rendered
        # from the record read the same spans only when the point holds that t itself
        object.__setattr__(self, "t", round(self.t, 3))

    def to_list(self) -> list[float | int]:
        return [self.t, self.private, self.shared, self.anonymous, self.swap,
                self.rss]

    @classmethod
    def from_list(cls, data: Any) -> MemoryPoint:
        if not isinstance(data, list) or len(data) != len(POINT_FIELDS) or not all(
                isinstance(v, NUMBER) and not isinstance(v, bool) for v in data):
            raise TypeError(f"points: each must be a list of {len(POINT_FIELDS)} numbers "
                            f"({', '.join(POINT_FIELDS)})")
        return cls(float(data[0]), *(int(v) for v in data[1:]))


@dataclass(frozen=True)
class DatasetContainer:
    """One container of Python objects a DataLoader's dataset held when it forked a
    worker (nsadiag.probes.forks): where in the dataset, its type, length, items' type and
    estimated bytes; ``line`` and ``code``: the line of the dataset's file that assigns it
    (``self.records = ...``), None when none was found."""

    path: str
    type: str
    length: int
    item_type: str
    estimated_bytes: int
    line: int | None = None
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "type": self.type, "length": self.length,
                               "item_type": self.item_type,
                               "estimated_bytes": self.estimated_bytes}
        if self.line is not None:
            out.update(line=self.line, code=self.code)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> DatasetContainer:
        if not isinstance(data, dict):
            raise TypeError("containers: each must be an object")
        return cls(path=str(optional(data, "path", str) or "?"),
                   type=str(optional(data, "type", str) or "?"),
                   length=int(optional(data, "length", int) or 0),
                   item_type=str(optional(data, "item_type", str) or "?"),
                   estimated_bytes=int(optional(data, "estimated_bytes", int) or 0),
                   line=optional(data, "line", int), code=optional(data, "code", str))


@dataclass(frozen=True)
class ForkedDataset:
    """The dataset a DataLoader shared with a worker it forked: its class, where the
    class's ``__init__`` is, its length and its containers of Python objects."""

    class_name: str
    file: str | None
    line: int | None
    length: int | None
    containers: tuple[DatasetContainer, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.class_name, "file": self.file, "line": self.line,
                "length": self.length, "containers": [c.to_dict() for c in self.containers]}

    def with_lines(self, found: Any) -> ForkedDataset:
        """This dataset with each container's assigning line: ``found(container)`` is
        (line, code) or None."""
        containers = []
        for container in self.containers:
            where = found(container)
            containers.append(replace(container, line=where[0], code=where[1])
                              if where else container)
        return replace(self, containers=tuple(containers))

    @classmethod
    def from_dict(cls, data: Any) -> ForkedDataset:
        if not isinstance(data, dict):
            raise TypeError("dataset: must be an object")
        return cls(class_name=str(optional(data, "class", str) or "?"),
                   file=optional(data, "file", str), line=optional(data, "line", int),
                   length=optional(data, "length", int),
                   containers=tuple(DatasetContainer.from_dict(c) for c in
                                    optional(data, "containers", list) or ()))


@dataclass(frozen=True)
class ProcessSeries:
    pid: int
    ppid: int | None
    command: str
    started: float | None
    points: tuple[MemoryPoint, ...]
    ended: bool = False
    forked_by: int | None = None
    """The watched process that forked it (its fork note), None when none noted it."""
    dataset: ForkedDataset | None = None

    @property
    def first(self) -> MemoryPoint | None:
        return self.points[0] if self.points else None

    @property
    def last(self) -> MemoryPoint | None:
        return self.points[-1] if self.points else None

    def peak(self, size: str) -> int:
        return max((getattr(p, size) for p in self.points), default=0)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "ppid": self.ppid, "command": self.command,
                               "started": self.started, "ended": self.ended,
                               "points": [p.to_list() for p in self.points]}
        if self.forked_by is not None:
            out["forked_by"] = self.forked_by
        if self.dataset is not None:
            out["dataset"] = self.dataset.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ProcessSeries:
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
            raise TypeError("series: each must be an object with an integer pid")
        dataset = optional(data, "dataset", dict)
        return cls(pid=data["pid"], ppid=optional(data, "ppid", int),
                   command=str(optional(data, "command", str) or ""),
                   started=optional(data, "started", NUMBER),
                   points=tuple(MemoryPoint.from_list(p)
                                for p in optional(data, "points", list) or ()),
                   ended=bool(optional(data, "ended", bool)),
                   forked_by=optional(data, "forked_by", int),
                   dataset=ForkedDataset.from_dict(dataset) if dataset else None)


@dataclass(frozen=True)
class ProcessMemory:
    """The series of every process (``series``), how often each was read (``interval_s``,
    the shortest spacing; slower when reading cost more), how many processes' series were
    left out to keep the record bounded (``left_out``) and why none could be read
    (``unavailable``: no /proc/PID/smaps_rollup on this system), when so."""

    interval_s: float
    series: tuple[ProcessSeries, ...] = ()
    left_out: int = 0
    unavailable: str | None = None
    read_s: float = 0.0
    """The seconds spent reading smaps_rollup in all."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"interval_s": self.interval_s, "left_out": self.left_out,
                               "read_s": round(self.read_s, 4),
                               "series": [s.to_dict() for s in self.series]}
        if self.unavailable:
            out["unavailable"] = self.unavailable
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ProcessMemory:
        if not isinstance(data, dict):
            raise TypeError("process_memory: must be an object")
        return cls(interval_s=float(optional(data, "interval_s", NUMBER) or 0.0),
                   series=tuple(ProcessSeries.from_dict(s)
                                for s in optional(data, "series", list) or ()),
                   left_out=int(optional(data, "left_out", int) or 0),
                   unavailable=optional(data, "unavailable", str),
                   read_s=float(optional(data, "read_s", NUMBER) or 0.0))

    def by_pid(self) -> dict[int, ProcessSeries]:
        return {s.pid: s for s in self.series}
