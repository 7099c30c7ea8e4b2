"""What a forked DataLoader worker was given: the dataset's containers of Python objects.

A dataset held as a list (dict, tuple, set, object array) of Python objects is shared with
every worker a DataLoader forks, page by page, until the worker reads an item: reading a
Python object writes its reference count, so the kernel copies the page into the worker
(copy-on-read, pytorch#13246). Which attribute holds those objects can only be read where
the dataset lives, and only before the fork: walking the objects in the worker would
itself write every reference count it passes, the very copying it is meant to explain.

``install(directory)`` registers, in the watched process, a hook that runs just before
each fork: when the fork is a DataLoader starting its workers (a frame of
torch/utils/data/dataloader.py holds the loader's iterator), the dataset's attributes are
read, two levels deep, and every container of Python objects among them is summed up:
where it is (``records`` or ``base.items``), its type, its length, the type of its
items and an estimate of its bytes (its own size plus its length times the mean deep size
of up to ``SAMPLED_ITEMS`` items spread over it). A numpy array of numbers, a tensor, a
bytes or str buffer hold no Python object per item and are left out. The summary of one
dataset is made once. The forked child then writes ``fork-<pid>.json`` into
``directory`` (pid, parent pid, time, the dataset's class and where it is defined, the
containers, largest first) with two system calls; nothing else changes in it. A fork
that is not a DataLoader's writes its note too, with no dataset. Standard library only;
a failure anywhere here is swallowed: the user's fork goes on as it would.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SAMPLED_ITEMS = 48
"""Items of a container whose deep size is measured to estimate the whole."""

MIN_LENGTH = 1000
"""A container shorter than this is not where a worker's copying comes from."""

LARGEST = 3
"""The containers kept per dataset, largest first."""

LOADER_FILE = os.path.join("torch", "utils", "data", "dataloader.py")
CONTAINERS = (list, tuple, dict, set, frozenset)
FILE_PREFIX = "fork-"


def _item_bytes(item: Any, depth: int = 2) -> int:
    """The size of one item with the objects it holds, ``depth`` levels down (a record
    dict's keys and values, and the token ids of a list among them): what a read of it can
    make the kernel copy."""
    size = sys.getsizeof(item)
    if depth == 0:
        return size
    if isinstance(item, dict):
        members: Any = [*item.keys(), *item.values()]
    elif isinstance(item, (list, tuple, set, frozenset)):
        members = item
    elif isinstance(getattr(item, "__dict__", None), dict):
        members = list(vars(item).values())
    else:
        return size
    if len(members) > SAMPLED_ITEMS:  # a long member: its length times a sampled mean
        stride = len(members) // SAMPLED_ITEMS
        picked = list(members)[::stride][:SAMPLED_ITEMS]
        return size + int(len(members) * sum(_item_bytes(m, depth - 1) for m in picked)
                          / len(picked))
    return size + sum(_item_bytes(m, depth - 1) for m in members)


def _object_array(value: Any) -> bool:
    dtype = getattr(value, "dtype", None)
    return type(value).__module__ == "numpy" and getattr(dtype, "kind", "") == "O"


def _summary(path: str, value: Any) -> dict[str, Any] | None:
    """The summary of ``value`` as a container of Python objects, None when it is not one
    (or too short to matter)."""
    if isinstance(value, CONTAINERS):
        items = list(value.values()) if isinstance(value, dict) else value
    elif _object_array(value):
        items = value.ravel()
    else:
        return None
    length = len(items)
    if length < MIN_LENGTH:
        return None
    if isinstance(items, (set, frozenset)):
        sampled = [item for _, item in zip(range(SAMPLED_ITEMS), items, strict=False)]
    else:
        stride = max(1, length // SAMPLED_ITEMS)
        sampled = [items[i] for i in range(0, length, stride)][:SAMPLED_ITEMS]
    mean = sum(map(_item_bytes, sampled)) / len(sampled)
    kinds = {type(item).__name__ for item in sampled}
    return {"path": path, "type": type(value).__name__, "length": length,
            "item_type": kinds.pop() if len(kinds) == 1 else "mixed",
            "estimated_bytes": int(sys.getsizeof(value) + mean * length)}


def dataset_containers(dataset: Any) -> list[dict[str, Any]]:
    """The containers of Python objects the dataset holds in its attributes and in theirs
    (a wrapped dataset: ``Subset.dataset``), largest first (``LARGEST`` at most)."""
    found: list[dict[str, Any]] = []
    seen: set[int] = set()
    level = [("", dataset)]
    for _ in range(2):
        deeper = []
        for prefix, owner in level:
            attributes = getattr(owner, "__dict__", None)
            if not isinstance(attributes, dict) or id(owner) in seen:
                continue
            seen.add(id(owner))
            for name, value in list(attributes.items()):
                path = f"{prefix}{name}"
                summary = _summary(path, value)
                if summary is not None:
                    found.append(summary)
                elif hasattr(value, "__dict__") and not isinstance(value, type):
                    deeper.append((path + ".", value))
        level = deeper
    return sorted(found, key=lambda s: -s["estimated_bytes"])[:LARGEST]


def _forking_loader_dataset() -> Any:
    """The dataset of the DataLoader whose iterator is starting workers on this thread
    now, None when this fork is not a DataLoader's. Only this thread's own frames are read
    (another thread's ``f_locals`` would write into its frame)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(LOADER_FILE) and \
                frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            dataset = getattr(owner, "_dataset", None)
            if dataset is not None:
                return dataset
        frame = frame.f_back
    return None


class ForkNotes:
    """The fork hooks of one watched process (see the module docstring)."""

    def __init__(self, directory: Path):
        self.directory = str(directory)
        self.pid = os.getpid()
        self.active = True
        self.summaries: dict[int, dict[str, Any]] = {}  # id(dataset) -> its summary
        self.pending: dict[str, Any] | None = None  # what the child of this fork writes

    def before(self) -> None:
        self.pending = None
        if not self.active or os.getpid() != self.pid:
            return
        try:
            self.pending = {"dataset": self._dataset_summary()}
        except Exception:  # noqa: BLE001 - the user's fork goes on whatever happens here
            self.pending = {"dataset": None}

    def _dataset_summary(self) -> dict[str, Any] | None:
        if "torch.utils.data" not in sys.modules:
            return None
        dataset = _forking_loader_dataset()
        if dataset is None:
            return None
        known = self.summaries.get(id(dataset))
        if known is None or known["length"] != _length(dataset):
            kind = type(dataset)
            init = getattr(kind.__init__, "__code__", None)
            known = {"class": kind.__qualname__, "length": _length(dataset),
                     "file": init.co_filename if init is not None else None,
                     "line": init.co_firstlineno if init is not None else None,
                     "containers": dataset_containers(dataset)}
            self.summaries[id(dataset)] = known
        return known

    def after_in_child(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None or os.getpid() == self.pid:
            return
        self.active = False  # a worker's own forks are not noted
        try:
            note = {"pid": os.getpid(), "ppid": self.pid, "t": time.time(), **pending}
            path = os.path.join(self.directory, f"{FILE_PREFIX}{os.getpid()}.json")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, json.dumps(note).encode())
            finally:
                os.close(fd)
        except Exception:  # noqa: BLE001 - nothing here may fail the user's worker
            pass

    def after_in_parent(self) -> None:
        self.pending = None


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:  # noqa: BLE001 - an iterable dataset has no length
        return None


def install(directory: Path) -> ForkNotes:
    """Note every fork of this process into ``directory`` (see the module docstring);
    ``ForkNotes.active = False`` stops it (a fork hook cannot be unregistered)."""
    notes = ForkNotes(directory)
    os.register_at_fork(before=notes.before, after_in_child=notes.after_in_child,
                        after_in_parent=notes.after_in_parent)
    return notes


def read_notes(directory: Path) -> list[dict[str, Any]]:
    """The fork notes in ``directory`` (each as written; unreadable ones left out)."""
    notes = []
    for path in sorted(directory.glob(f"{FILE_PREFIX}*.json")):
        try:
            if path.is_symlink() or path.stat().st_size > 64 * 1024:
                continue
            note = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(note, dict) and isinstance(note.get("pid"), int):
            notes.append(note)
    return notes
