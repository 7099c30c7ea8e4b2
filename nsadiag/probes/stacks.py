"""Stacks of a live process through py-spy, its CPU time from /proc, and what they show.

``capture`` never raises: when a sample cannot be had it returns one line saying why
(py-spy missing, ptrace refused, process gone, timeout). The analysis helpers at the end
(``collective_frame``, ``wait_frame``, ``stacks_change``, ``classify``) are pure.

The capture ladder: py-spy ``dump --nonblocking``; with ``native``, ``dump --native`` under
a hard deadline (py-spy resumes the target itself); when py-spy is missing or fails on a
live process, the faulthandler dump. That last rung sends SIGUSR1, whose default action
terminates a process, so it is taken only when both hold:

- the file the process dumps into is known: given by the caller, or the process is a
  child of nsadiag (its command line is ``-m nsadiag.harness.child JOB``; the job's
  out_dir, or its rank-<r>/, holds faulthandler.txt, registered by
  ``nsadiag.harness.child.arm_faulthandler``), or the process holds a file named
  faulthandler.txt open (``arm_faulthandler`` keeps it open: processes under
  ``nsadiag run`` and ``nsadiag.watch()``);
- /proc/PID/status shows a handler installed for SIGUSR1 (the ``SigCgt`` mask), so a
  trial child still starting up, before it armed faulthandler, is never signalled.

Otherwise the reason is returned, e.g. "faulthandler fallback not possible: the process did
not register SIGUSR1", and the process is left alone.

py-spy facts this module relies on (py-spy 0.4): ``dump --json`` prints a list of Python
threads, each with ``frames`` innermost first; a native frame has ``module`` set to its
shared object, a Python frame has ``module: null``; unresolved native symbols are printed
as hex addresses; ``--native`` cannot be combined with ``--nonblocking``, so a native dump
briefly pauses the process.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from nsadiag.evidence import StackFrame, StackSample, ThreadStack


def py_spy_path() -> Path | None:
    """The py-spy next to the running interpreter (a venv's bin), else the one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return beside
    found = shutil.which("py-spy")
    return Path(found) if found else None


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat from field 3 (state) on; None when the process is gone.

    The command name (field 2) may hold spaces and parentheses, so split after its last ')'.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid``, all its threads, None when it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _source_line(file: str, line: int) -> str | None:
    """The stripped source line, None when the file cannot be read here."""
    text = linecache.getline(file, line).strip() if line > 0 else ""
    return text or None


KEEP_LOCALS = frozenset({"_worker_loop"})
"""Functions whose locals (from ``dump --locals``) are kept: they say what a process is (a
DataLoader worker loop's ``worker_id``)."""


def _frame(raw: dict[str, Any]) -> StackFrame:
    """One py-spy frame; native frames are the ones with a shared-object ``module``."""
    is_native = raw.get("module") is not None
    file = str(raw.get("filename") or "")
    line = int(raw.get("line") or 0)
    code = None if is_native else _source_line(file, line)
    function = str(raw.get("name", "?"))
    kept = None
    if raw.get("locals") and function.rsplit(".", 1)[-1] in KEEP_LOCALS:
        kept = {str(item.get("name")): str(item.get("repr"))[:80] for item in raw["locals"]}
    return StackFrame(function=function, file=file, line=line, is_native=is_native,
                      code=code, locals=kept)


def _thread(raw: dict[str, Any]) -> ThreadStack:
    return ThreadStack(
        thread_id=int(raw.get("thread_id", 0)),
        name=raw.get("thread_name"),
        frames=[_frame(frame) for frame in raw.get("frames", [])],
        os_thread_id=raw.get("os_thread_id"),
        active=bool(raw.get("active", True)),
        owns_gil=bool(raw.get("owns_gil", False)),
    )


def parse_py_spy_json(text: str, pid: int, cpu_seconds: float | None, *,
                      t: float | None = None) -> StackSample:
    """A StackSample from the output of ``py-spy dump --json --pid PID [--native]``.

    ``t`` is the sample time (now when omitted); ``native`` is True when any frame is
    native. Raises ValueError when ``text`` is not py-spy's JSON list of threads.
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"py-spy JSON: expected a list of threads, got {type(data).__name__}")
    threads = [_thread(raw) for raw in data]
    native = any(frame.is_native for thread in threads for frame in thread.frames)
    return StackSample(t=time.time() if t is None else t, pid=pid, threads=threads,
                       cpu_seconds=cpu_seconds, native=native)


@dataclass
class _Dump:
    """One py-spy run: ``kind`` is "ok" (``text`` is its JSON) or why not, "gone",
    "refused", "timeout" or "failed" (``text`` is then the one-line reason)."""

    kind: str
    text: str


def _failure(pid: int, returncode: int, stderr: str) -> _Dump:
    """Why py-spy exited with ``returncode``: the process went away, ptrace was refused,
    or something else (py-spy's last line of stderr)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "no message"
    if not _alive(pid):
        return _Dump("gone", f"py-spy: process {pid} is gone")
    lowered = stderr.lower()
    if "permission denied" in lowered or "not permitted" in lowered or "ptrace" in lowered:
        return _Dump("refused", f"py-spy: ptrace refused for pid {pid} ({last})")
    return _Dump("failed", f"py-spy: failed with exit {returncode} ({last})")


def _dump(exe: Path, pid: int, flags: list[str], timeout_s: float) -> _Dump:
    """Run ``py-spy dump --json`` once under a hard timeout (py-spy is killed at it)."""
    command = [str(exe), "dump", "--json", "--pid", str(pid), *flags]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return _Dump("timeout", f"py-spy: timed out after {timeout_s:g} s on pid {pid}")
    except OSError as err:
        return _Dump("failed", f"py-spy: cannot run {exe} ({err})")
    if done.returncode != 0:
        return _failure(pid, done.returncode, done.stderr)
    return _Dump("ok", done.stdout)


def _parsed(dump: _Dump, pid: int, cpu_seconds: float | None, t: float) -> StackSample | str:
    if dump.kind != "ok":
        return dump.text
    try:
        return parse_py_spy_json(dump.text, pid, cpu_seconds, t=t)
    except (ValueError, TypeError, KeyError) as err:
        return f"py-spy: unreadable output ({err})"


def capture(pid: int, native: bool = False, timeout_s: float = 10.0,
            faulthandler_file: Path | None = None, local_names: bool = False
            ) -> StackSample | str:
    """One stack sample of ``pid``, or a one-line reason why there is none.

    Without ``native`` the py-spy dump is ``--nonblocking`` (the process is not paused).
    With ``native`` it is ``--native``, which py-spy only does while pausing the process;
    if that fails while the process is alive and traceable, a nonblocking Python-only dump
    follows and the sample's ``note`` says why native frames are missing. ``timeout_s``
    bounds all py-spy runs together. When py-spy gives nothing for a live process, the
    faulthandler rung follows (see the module docstring; ``faulthandler_file`` names the
    dump file when the process is not a trial child). ``local_names`` asks a nonblocking
    dump for the locals of the frames in KEEP_LOCALS too. Never raises.
    """
    sample = _capture_py_spy(pid, native, timeout_s, local_names)
    if isinstance(sample, StackSample) or not _alive(pid):
        return sample
    fallback = faulthandler_capture(pid, faulthandler_file)
    if isinstance(fallback, StackSample):
        fallback.note = f"{FROM_FAULTHANDLER}: {sample}"
        return fallback
    return f"{sample}; {fallback}"


def _capture_py_spy(pid: int, native: bool, timeout_s: float,
                    local_names: bool = False) -> StackSample | str:
    exe = py_spy_path()
    if exe is None:
        return "py-spy: not found beside the interpreter or on PATH"
    if not _alive(pid):
        return f"py-spy: process {pid} is gone"
    deadline = time.monotonic() + timeout_s
    cpu_seconds, t = process_cpu_seconds(pid), time.time()
    if not native:
        flags = ["--nonblocking", "--locals"] if local_names else ["--nonblocking"]
        return _parsed(_dump(exe, pid, flags, timeout_s), pid, cpu_seconds, t)
    first = _dump(exe, pid, ["--native"], timeout_s)
    if first.kind != "failed":
        return _parsed(first, pid, cpu_seconds, t)
    left = max(0.5, deadline - time.monotonic())
    sample = _parsed(_dump(exe, pid, ["--nonblocking"], left), pid, cpu_seconds, t)
    if isinstance(sample, StackSample):
        sample.note = f"native frames unavailable: {first.text}"
    return sample


FROM_FAULTHANDLER = "stacks from faulthandler"
"""How the note of a sample taken by the faulthandler rung begins (``capture``)."""


def from_faulthandler(sample: StackSample) -> bool:
    """Whether ``sample`` came from the faulthandler rung, which names no thread (its
    "MainThread" and "current thread" are guesses from the frames and the signal)."""
    return (sample.note or "").startswith(FROM_FAULTHANDLER)


def carry_thread_names(samples: list[StackSample]) -> None:
    """Give each thread the name py-spy read for it in any sample of the same process.

    On a loaded machine a sample late in a capture window may be cut off and be taken by
    the faulthandler rung instead, and py-spy itself leaves a name out when it cannot read
    the ``threading`` module's table: without this the last sample, the one a wait chain
    reads, calls a thread by its ident ("thread 1406...") where the others said "loader".
    A thread is the same thread in every sample of a process by its ident (py-spy's
    ``thread_id`` and faulthandler's "Thread 0x..." are both the ``threading`` ident); a
    name py-spy read replaces a missing one and the faulthandler rung's guesses, never
    another name py-spy read."""
    named: dict[tuple[int, int], str] = {}
    for sample in samples:
        if from_faulthandler(sample):
            continue
        for thread in sample.threads:
            if thread.name:
                named[(sample.pid, thread.thread_id)] = thread.name
    for sample in samples:
        guessed = from_faulthandler(sample)
        for thread in sample.threads:
            name = named.get((sample.pid, thread.thread_id))
            if name is not None and (thread.name is None or guessed):
                thread.name = name


# ---- faulthandler, the last rung ------------------------------------------------------------

FAULTHANDLER_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
FAULTHANDLER_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')
DUMP_SETTLE_S = 0.1
DUMP_DEADLINE_S = 3.0


def catches_sigusr1(pid: int) -> bool:
    """Whether /proc/PID/status shows a handler installed for SIGUSR1 (SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    return False


def _environ(pid: int) -> dict[str, str]:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return {}


def trial_dump_file(pid: int) -> Path | None:
    """faulthandler.txt of a child of nsadiag.harness.child (the job's out_dir, or its
    rank-<r>/ under torchrun), else None."""
    try:
        process = psutil.Process(pid)
        argv, cwd = process.cmdline(), Path(process.cwd())
    except psutil.Error:
        return None
    for i, arg in enumerate(argv[:-2]):
        if arg == "-m" and argv[i + 1] == "nsadiag.harness.child":
            try:
                job = json.loads((cwd / argv[i + 2]).read_text())
                directory = cwd / job["spec"]["out_dir"]
            except (OSError, ValueError, KeyError, TypeError):
                return None
            if int(job.get("world_size", 1)) > 1:
                rank = _environ(pid).get("RANK")
                if rank is None:
                    return None
                directory = directory / f"rank-{rank}"
            return directory / "faulthandler.txt"
    return None


def open_file_named(pid: int, name: str) -> Path | None:
    """A file called `name` that the process holds open, None when it holds none."""
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(target) == name and os.path.isabs(target):
            return Path(target)
    return None


def open_dump_file(pid: int) -> Path | None:
    """The faulthandler.txt the process holds open: nsadiag's heartbeat keeps it open for
    the process's lifetime (a process under ``nsadiag run``, inside ``nsadiag.watch()``, a
    trial child); None when it holds none."""
    return open_file_named(pid, "faulthandler.txt")


def faulthandler_target(pid: int, dump_file: Path | None = None) -> Path | str:
    """The dump file to read after SIGUSR1, or why the fallback is not possible."""
    if not catches_sigusr1(pid):
        return "faulthandler fallback not possible: the process did not register SIGUSR1"
    path = dump_file or trial_dump_file(pid) or open_dump_file(pid)
    if path is None:
        return (f"faulthandler fallback not possible: pid {pid} holds no faulthandler.txt "
                f"nsadiag armed, so where its dump would be written is unknown")
    return path


def parse_faulthandler(text: str, pid: int, cpu_seconds: float | None, *,
                       t: float | None = None) -> StackSample:
    """A StackSample from one faulthandler dump of all threads ("Thread 0x... (most recent
    call first):" then '  File "f", line N in func' lines, innermost first). faulthandler
    does not say which threads run, so every thread counts as active. ValueError when the
    text holds no thread."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        header = FAULTHANDLER_THREAD.match(line)
        if header:
            name = "current thread" if header.group(1) == "Current thread" else None
            threads.append(ThreadStack(thread_id=int(header.group(2), 16), name=name,
                                       frames=[]))
            continue
        frame = FAULTHANDLER_FRAME.match(line)
        if frame and threads:
            file, number = frame.group("file"), int(frame.group("line"))
            threads[-1].frames.append(StackFrame(function=frame.group("func"), file=file,
                                                 line=number, code=_source_line(file, number)))
    if not threads:
        raise ValueError("faulthandler dump: no thread in it")
    for thread in threads:
        # faulthandler names no thread; the main thread is the one whose outermost frame
        # is a module's top level (a thread that `threading` started begins in _bootstrap)
        if thread.frames and thread.frames[-1].function == "<module>":
            thread.name = "MainThread"
    return StackSample(t=time.time() if t is None else t, pid=pid, threads=threads,
                       cpu_seconds=cpu_seconds, native=False)


def _new_text(path: Path, offset: int) -> str:
    """What was appended to `path` after `offset`, once it stopped growing."""
    deadline = time.monotonic() + DUMP_DEADLINE_S
    last = -1
    while time.monotonic() < deadline:
        size = path.stat().st_size if path.exists() else 0
        if size > offset and size == last:
            break
        last = size
        time.sleep(DUMP_SETTLE_S)
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode("utf-8", "replace")


def faulthandler_capture(pid: int, dump_file: Path | None = None) -> StackSample | str:
    """SIGUSR1 to a process that registered faulthandler for it, and its dump parsed;
    a one-line reason when that is not possible or nothing was written. Never raises."""
    target = faulthandler_target(pid, dump_file)
    if isinstance(target, str):
        return target
    try:
        offset = target.stat().st_size if target.exists() else 0
        cpu_seconds, t = process_cpu_seconds(pid), time.time()
        os.kill(pid, signal.SIGUSR1)
        return parse_faulthandler(_new_text(target, offset), pid, cpu_seconds, t=t)
    except ProcessLookupError:
        return f"faulthandler: process {pid} is gone"
    except (OSError, ValueError) as err:
        return f"faulthandler: no dump read from {target} ({err})"
