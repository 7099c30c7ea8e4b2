"""The heartbeat's slot: how progress still reaches the watcher when the run directory's disk
is full.

A heartbeat file (nsadiag.harness.heartbeat) grows by appends, and on a full disk an append
fails. Progress must not depend on whether nsadiag's own files can be written, so each
heartbeat file has a slot beside it (``events.slot``), a file of SLOT_BYTES allocated when
the heartbeat starts (``posix_fallocate``: the space is the file's from then on, so
rewriting it needs no new block). Until the disk refuses an append the slot stays zeros and
costs nothing. From the first refused append on, the writer keeps in memory what the file
no longer gets and rewrites the slot in place, at most every SLOT_WRITE_S and at the end,
with one JSON document ended by a NUL byte:

    lost      why the file stopped ("events after #N not written: No space left on device")
    lost_t    when (unix time)
    counts    every event kind not written to the file since then, with its count
    events    the latest SLOT_EVENTS of those events, whole (as many as fit)

The watcher (nsadiag.harness.streams.Stream) reads the slot when the file gives nothing
new, takes the events it has not seen (by seq) as it takes the file's, and adds to its
counts what ``counts`` holds beyond the events it took: the stall clock sees the real
progress and the counts stay true. A torn read (the writer rewrote the slot while it was
read) fails to parse and is read again at the next poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLOT_SUFFIX = ".slot"
SLOT_BYTES = 64 * 1024
"""Room for the latest events (about 300 bytes each) and the counts, with margin."""
SLOT_EVENTS = 64
SLOT_WRITE_S = 0.1
"""The slot is rewritten at most this often (a pwrite of up to SLOT_BYTES): the watcher
polls about as often, and a full disk is no time to add writes."""


def slot_path(events_path: Path) -> Path:
    """The slot of a heartbeat file: events.jsonl -> events.slot."""
    return events_path.with_suffix(SLOT_SUFFIX)


class SlotWriter:
    """The child's side (see the module docstring); its methods are called under the
    heartbeat writer's lock."""

    def __init__(self, events_path: Path | None):
        """The slot of ``events_path``; none (every method a no-op) for None."""
        self.fd: int | None = None
        self.lost: str | None = None
        self.lost_t = 0.0
        self.counts: Counter = Counter()
        self.events: deque[bytes] = deque(maxlen=SLOT_EVENTS)
        self.written = float("-inf")  # time.monotonic() of the last rewrite
        if events_path is None:
            return
        try:
            fd = os.open(slot_path(events_path), os.O_RDWR | os.O_CREAT | os.O_TRUNC |
                         os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError:
            return  # the disk is full already, or the directory refuses: no slot
        try:
            os.posix_fallocate(fd, 0, SLOT_BYTES)
        except OSError:
            os.close(fd)  # a file system that cannot allocate ahead gets no slot
            with contextlib.suppress(OSError):
                os.unlink(slot_path(events_path))
            return
        self.fd = fd

    def lose(self, why: str, batch: list[tuple[str, bytes]]) -> None:
        """The file refused an append: ``batch`` (kind, encoded line) is what it did not
        get; from now on every event comes here (``add``)."""
        self.lost, self.lost_t = why, time.time()
        for kind, line in batch:
            self.add(kind, line, _steps_of(line) if kind == "step" else 1)

    def add(self, kind: str, line: bytes, weight: int = 1) -> None:
        """An event the file did not get (``weight``: the steps a thinned step event
        stands for); the slot is rewritten when it is due."""
        self.counts[kind] += weight
        self.events.append(line.rstrip(b"\n"))
        if kind == "end" or time.monotonic() - self.written >= SLOT_WRITE_S:
            self.write()

    def write(self) -> None:
        """Rewrite the slot with what it holds now (nothing before a loss)."""
        if self.fd is None or self.lost is None:
            return
        head = json.dumps({"lost": self.lost, "lost_t": self.lost_t,
                           "counts": dict(self.counts)}, separators=(",", ":"))[:-1]
        events = list(self.events)
        while True:
            data = (f'{head},"events":['.encode() + b",".join(events) + b"]}\0")
            if len(data) <= SLOT_BYTES or not events:
                break
            events = events[len(events) // 4 + 1:]  # the oldest go first
        with contextlib.suppress(OSError):
            os.pwrite(self.fd, data[:SLOT_BYTES], 0)
        self.written = time.monotonic()

    def close(self) -> None:
        if self.fd is not None:
            self.write()
            os.close(self.fd)
            self.fd = None


def _steps_of(line: bytes) -> int:
    """The steps a step event stands for (a thinned one's ``steps``, else 1)."""
    try:
        return int(json.loads(line).get("steps") or 1)
    except (ValueError, TypeError, AttributeError):
        return 1


@dataclass(frozen=True)
class Slot:
    """What a slot held when read: ``lost`` and ``lost_t`` (see the module docstring),
    ``counts`` by kind, ``events`` the latest of them, parsed."""

    lost: str
    lost_t: float
    counts: dict[str, int]
    events: list[dict[str, Any]]


def read_slot(events_path: Path) -> Slot | None:
    """The slot of a heartbeat file as it is now; None while it holds nothing (no loss),
    when it is missing, or when the read was torn."""
    try:
        fd = os.open(slot_path(events_path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.pread(fd, 1, 0) in (b"", b"\0"):
            return None
        data = os.pread(fd, SLOT_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.split(b"\0", 1)[0])
        counts = {str(k): int(v) for k, v in doc["counts"].items()}
        events = [e for e in doc["events"] if isinstance(e, dict)]
        return Slot(str(doc["lost"]), float(doc["lost_t"]), counts, events)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
