"""Exception messages whose cause is known, and how to read a child's traceback (pure)."""

from __future__ import annotations

import re
from typing import Any

from nsadiag.probes.frames import LIBRARY_PATH

OOM_TYPES = frozenset({"OutOfMemoryError", "MemoryError"})
OOM_MESSAGE = re.compile(
    r"out of memory|can't allocate memory|cannot allocate memory|not enough memory",
    re.IGNORECASE)
TRACEBACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$',
                             re.MULTILINE)


def project_frame(traceback: str) -> str | None:
    """The innermost traceback frame outside installed packages and the standard library,
    preferring the model's code over nsadiag's own trial harness."""
    frames = [m for m in TRACEBACK_FRAME.finditer(traceback) if not LIBRARY_PATH.search(m["file"])]
    preferred = [m for m in frames if "/nsadiag/" not in m["file"]] or frames
    if not preferred:
        return None
    match = preferred[-1]
    return f"{match['file']}:{match['line']} in {match['func'].strip()}"



def is_oom_exception(exception: dict[str, Any], child_says_oom: bool) -> bool:
    """True when the child flagged the exception as an allocation failure, or its type or
    message names memory exhaustion."""
    kind = str(exception.get("type", "")).rsplit(".", 1)[-1]
    message = str(exception.get("message", ""))
    return child_says_oom or kind in OOM_TYPES or bool(OOM_MESSAGE.search(message))



READY_TWICE = re.compile(r"Expected to mark a variable ready only once|marked as ready twice")
READY_TWICE_ERROR = "ddp-ready-twice"
"""The name a verdict records for DDP's "marked as ready twice" (facts.known_error)."""

READY_TWICE_PARAMETER = re.compile(r"with name (?P<name>\S+) has been marked as ready twice")


SHM_ERROR = "dataloader-shared-memory"
PORT_ERROR = "address-in-use"
FILES_ERROR = "too-many-open-files"
COLLECTIVE_TIMEOUT = "collective-timeout"
DEVICE_ASSERT = "cuda-device-assert"
KNOWN_ERRORS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (SHM_ERROR, re.compile(
        r"unable to (?:allocate|write to file|open shared memory)[^\n]*(?:shared memory|/torch_|"
        r"shm)|shared memory \(shm\)|No space left on device[^\n]*(?:shm|/torch_)|"
        r"(?:Bus error|SIGBUS)[^\n]*(?:DataLoader|shared memory)", re.IGNORECASE),
     "a DataLoader worker could not put its batch into shared memory: /dev/shm is full or "
     "too small (a container's default is 64 MB)"),
    (PORT_ERROR, re.compile(r"Address already in use|EADDRINUSE|errno: 98\b"),
     "the address (host and port) is already taken: another job, or an earlier run that "
     "still holds it"),
    (FILES_ERROR, re.compile(r"Too many open files|EMFILE|errno 24\b", re.IGNORECASE),
     "the process reached its limit of open file descriptors"),
    (COLLECTIVE_TIMEOUT, re.compile(
        r"Watchdog caught collective operation timeout|collective operation timeout|"
        r"(?:NCCL|Gloo|gloo|ProcessGroup\w*)[^\n]*(?:timed out|timeout)|Timed out waiting "
        r"\d+ms for recv", re.IGNORECASE),
     "a collective waited past the process group's timeout: another rank never reached it"),
    (DEVICE_ASSERT, re.compile(r"device-side assert triggered"),
     "a CUDA kernel's assertion failed (most often an index out of range: a label not below "
     "the number of classes, an embedding index past the table)"),
)
"""Errors whose cause their message names: (the known error's name, its pattern over the
exception's type and message, the cause); nsadiag.finding.known_fixes holds what to do."""


def explain_exception(kind: str, message: str) -> dict[str, Any] | None:
    """The cause of an exception whose message is known, with the name of that known
    error (``known``; nsadiag.finding.known_fixes holds what to do about it), else None.

    DDP's "Expected to mark a variable ready only once" / "marked as ready twice": a
    parameter received its gradient twice in one backward. Under reentrant gradient
    checkpointing that happens when a segment's recompute runs other modules than its
    forward did: a closure like ``lambda x: blk(x)`` inside ``for blk in blocks`` looks
    ``blk`` up when the recompute calls it, after the loop, so every segment recomputes the
    last block and back-propagates into its parameters once per segment.
    """
    if not READY_TWICE.search(message):
        text = f"{kind}: {message}"
        for known, pattern, cause in KNOWN_ERRORS:
            if pattern.search(text):
                return {"cause": cause, "parameter": None, "known": known}
        return None
    named = READY_TWICE_PARAMETER.search(message)
    parameter = named["name"] if named else None
    cause = ("a parameter received its gradient twice in one backward"
             + (f" ({parameter})" if parameter else "")
             + ": with reentrant checkpointing this happens when a segment's recompute runs "
               "other modules than its forward did, e.g. a late-bound closure `lambda x: "
               "blk(x)` inside `for blk in blocks`, which recomputes the last block for every "
               "segment, so its parameters become ready once per segment")
    return {"cause": cause, "parameter": parameter, "known": READY_TWICE_ERROR}

