"""What a process that died of a signal left behind, read for the verdict.

A watched process has faulthandler armed for fatal signals (nsadiag.harness.child
.arm_faulthandler): when native code aborts (a C++ exception nobody caught: "terminate
called after throwing ..."), segfaults or hits a bus error, faulthandler appends "Fatal
Python error: Aborted" and every thread's Python stack to the process's faulthandler.txt
before the process dies. Native libraries print their own last words to stderr (the C++
runtime's "terminate called ...", gloo's "Received data size doesn't match expected size",
NCCL errors), and torchrun logs which local rank failed with which exit code and pid.

``read(directory, stderr_path, pid)`` gathers them: {"error", "signal", "where",
"call", "thread", "stderr"}: the fatal error faulthandler named and the signal it stands
for (or the one torchrun logged for this pid), where the thread to blame was in the user's
code and the innermost call it was in ("all_reduce (distributed_c10d.py:2990)"), which
thread that is ("crashing", or "main" when a native thread without Python frames took the
signal), and the telling lines of stderr. nsadiag's own frames (the collective counter's
wrapper, the trial harness) are never named as the user's. None when the process left
nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from nsadiag.evidence import StackFrame
from nsadiag.probes.frames import own_code
from nsadiag.probes.stacks import FAULTHANDLER_FRAME, FAULTHANDLER_THREAD

FATAL = re.compile(r"^Fatal Python error: (?P<error>.+?)\s*$", re.MULTILINE)
SIGNAL_OF_ERROR = {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV",
                   "Bus error": "SIGBUS", "Floating-point exception": "SIGFPE",
                   "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}
"""faulthandler's words for the fatal signals it reports."""
TELLING = re.compile(
    r"terminate called|what\(\)|doesn't match expected size|collective mismatch|"
    r"EnforceNotMet|NCCL (?:error|WARN)|nccl\w*Error|ProcessGroupNCCL|ProcessGroupGloo|"
    r"CUDA error|illegal memory access|device-side assert|Segmentation fault|Bus error|"
    r"core dumped|Fatal Python error",
    re.IGNORECASE)
"""stderr lines that say why native code ended a process."""
TORCHRUN_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: "
                             r"(?P<local>\d+) \(pid: (?P<pid>\d+)\)")
STDERR_TAIL = 400
"""The last this many lines of stderr are searched."""
KEEP_LINES = 4
LINE_CHARS = 400


def _signal_name(code: int) -> str | None:
    import signal

    try:
        return signal.Signals(-code).name if code < 0 else None
    except ValueError:
        return None


def fatal_dump(text: str) -> dict[str, Any] | None:
    """The last fatal-error dump in a faulthandler file's text: the error, the frames of
    the thread to blame (innermost first) and which it is: "crashing" when the thread that
    received the signal has Python frames, else "main" (the signal came from a native
    thread, e.g. a process group's transport thread: the main thread's stack says what the
    program was doing); None without a dump."""
    found = list(FATAL.finditer(text))
    if not found:
        return None
    last = found[-1]
    threads: list[tuple[bool, list[StackFrame]]] = []
    for line in text[last.end():].splitlines():
        header = FAULTHANDLER_THREAD.match(line)
        if header:
            threads.append((header.group(1) == "Current thread", []))
            continue
        frame = FAULTHANDLER_FRAME.match(line)
        if frame and threads:
            threads[-1][1].append(StackFrame(function=frame.group("func"),
                                             file=frame.group("file"),
                                             line=int(frame.group("line"))))
    crashing = next((frames for current, frames in threads if current and frames), None)
    if crashing is not None:
        return {"error": last.group("error"), "frames": crashing, "thread": "crashing"}
    main = next((frames for _, frames in threads
                 if frames and not frames[-1].file.endswith("threading.py")), [])
    return {"error": last.group("error"), "frames": main, "thread": "main"}


def _places(frames: list[StackFrame]) -> tuple[str | None, str | None]:
    """(the innermost frame of the user's own code, the innermost frame below it that is
    not nsadiag's): where the crashing thread was, and the call it was in."""
    mine = next((i for i, frame in enumerate(frames) if own_code(frame)), None)
    if mine is None:
        return None, frames[0].where() if frames else None
    below = [frame for frame in frames[:mine] if "/nsadiag/" not in frame.file]
    return frames[mine].where(), below[0].where() if below else None


def _stderr_lines(stderr_path: Path | None) -> list[str]:
    if stderr_path is None:
        return []
    try:
        lines = stderr_path.read_text(errors="replace").splitlines()[-STDERR_TAIL:]
    except OSError:
        return []
    return lines


def telling_lines(lines: list[str]) -> list[str]:
    """The stderr lines that say why native code ended a process, first ones first, each
    once and cut to LINE_CHARS."""
    found: list[str] = []
    for line in lines:
        text = line.strip()
        if TELLING.search(text) and text[:LINE_CHARS] not in found:
            found.append(text[:LINE_CHARS])
    return found[:KEEP_LINES]


def torchrun_signal(lines: list[str], pid: int | None) -> str | None:
    """The signal torchrun logged for the rank of ``pid`` ("failed (exitcode: -6) ...
    (pid: N)"), None when it logged none."""
    if pid is None:
        return None
    for line in reversed(lines):
        match = TORCHRUN_FAILED.search(line)
        if match and int(match.group("pid")) == pid:
            return _signal_name(int(match.group("code")))
    return None


def read(directory: Path, stderr_path: Path | None, pid: int | None) -> dict[str, Any] | None:
    """What the process that wrote into ``directory`` left when it died (see the module
    docstring); None when it left nothing."""
    try:
        dump = fatal_dump((directory / "faulthandler.txt").read_text(errors="replace"))
    except OSError:
        dump = None
    lines = _stderr_lines(stderr_path)
    signal = torchrun_signal(lines, pid)
    if dump is None and signal is None:
        return None
    where, call = _places(dump["frames"]) if dump else (None, None)
    error = dump["error"] if dump else None
    return {"error": error, "signal": SIGNAL_OF_ERROR.get(error or "") or signal,
            "where": where, "call": call, "thread": dump["thread"] if dump else None,
            "stderr": telling_lines(lines)}
