"""What stack samples show: pure analysis of ``StackSample`` objects (no I/O, no clock).

Which frame is a collective, a lock wait, the interpreter itself; whether stacks change
between samples; what several samples of one process read as (``classify``); the hot frame
over the running threads and the user's own innermost frame; the odd ranks out of a group
of processes. The capture side (py-spy, faulthandler, /proc) is ``nsadiag.probes.stacks``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from nsadiag.evidence import StackFrame, StackSample, ThreadStack

IDLE_CPU_FRACTION = 0.1
"""Below this many CPU seconds per wall second a process is idle (waiting). Defined here,
below the verdicts, because ``classify`` reads it too; nsadiag.verdict.thresholds names it
among the verdicts' figures, with where it comes from."""

COLLECTIVE_FUNCTIONS = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "_all_gather_base", "broadcast", "broadcast_object_list",
    "barrier", "monitored_barrier", "reduce_scatter", "reduce_scatter_tensor",
    "_reduce_scatter_base", "all_to_all", "all_to_all_single", "gather_object",
    "scatter_object_list",
})
"""Python functions that are collectives wherever they are defined."""

C10D_FILE = "distributed/distributed_c10d.py"
"""Every function of torch.distributed's collective API lives in this file."""

SETUP_FUNCTIONS = frozenset({
    "init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
    "destroy_process_group", "init_device_mesh",
})
"""torch.distributed's calls that set process groups up (they wait for every rank to join
a rendezvous) rather than run a collective."""
RENDEZVOUS_FILE = "distributed/rendezvous.py"
NATIVE_COLLECTIVE_MARKERS = ("ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupMPI",
                             "c10d::", "gloo::", "nccl")
"""Substrings of native symbols inside a process group or its transport."""

BACKGROUND_LOOP_MARKERS = ("runLoop", "workerLoop", "Watchdog", "watchdog", "heartbeatMonitor")
"""Native symbols of process-group helper threads that idle in waits all the time."""

WAIT_FUNCTION = re.compile(r"acquire|wait|futex|mutex|sem_|(?:^|[^a-z])lock(?:[^a-z]|$)",
                           re.IGNORECASE)
"""Function names of lock and condition waits, Python or native (not ``block``/``clock``)."""

WAIT_CODE = re.compile(r"\.(?:acquire|wait|join)\(|^with\b.*lock\w*\s*:", re.IGNORECASE)
"""Source lines that block on a lock: ``lock.acquire()``, ``cond.wait()``, ``with lock:``."""

INTERPRETER_MODULE = re.compile(r"libpython|/bin/python")
"""Shared objects of the CPython interpreter itself."""
BUILTIN_MODULE_CALL = re.compile(
    r"^_?(?:sre|json|pickle|struct|bisect|heapq|csv|elementtree|hashlib|zlib|bz2|lzma|"
    r"decimal|unicodedata|blake2|sha\d*|md5)_|^_?sre|^scanner_call|^_?json|^_?pickle|"
    r"^_?ssl_|^_?socket_", re.IGNORECASE)
"""Symbols of C modules compiled into libpython (the regular-expression engine ``_sre``,
``_json``, ``_pickle``, ...): a thread under one of them runs a native call, not Python."""

LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/lib/python3\.\d+/|^<|"
                          r"/torchinductor_[^/]*/|/\.triton/|/triton_cache/|"
                          r"/(?P<key>[a-z0-9]{2})/c(?P=key)[a-z0-9]{49}\.py$")
"""Traceback files that belong to installed packages or the standard library, or that a
compiler generated (inductor's output under /tmp/torchinductor_USER, or under any
TORCHINDUCTOR_CACHE_DIR: inductor names a module "c" and a 51-character hash, in a folder
named by the hash's first two characters; triton's caches): never the user's own code."""

OWN_THREAD_PREFIX = "nsadiag-"
"""The name of every thread nsadiag starts inside a watched process (the progress sampler,
the torch-hook installer, the Flight Recorder's dump thread)."""


def nsadiag_thread(thread: ThreadStack) -> bool:
    """A thread nsadiag itself runs inside the watched process: named so, or (a
    faulthandler dump names no thread) a started thread whose Python frames are all
    nsadiag's and the threading module's. Never the main thread: a trial child's main
    thread runs nsadiag's harness below the user's code."""
    if thread.name == "MainThread":
        return False
    if thread.name and thread.name.startswith(OWN_THREAD_PREFIX):
        return True
    python = thread.python_frames()
    if not python or not python[-1].file.endswith("threading.py"):
        return False  # not a thread started by the threading module: the main thread
    return all("/nsadiag/" in frame.file or frame.file.endswith("threading.py")
               for frame in python) and any("/nsadiag/" in frame.file for frame in python)


def user_threads(sample: StackSample) -> list[ThreadStack]:
    """The threads of a sample that are not nsadiag's own (``nsadiag_thread``)."""
    return [thread for thread in sample.threads if not nsadiag_thread(thread)]


def _is_collective(frame: StackFrame) -> bool:
    if frame.is_native:
        return any(marker in frame.function for marker in NATIVE_COLLECTIVE_MARKERS)
    return frame.function in COLLECTIVE_FUNCTIONS or frame.file.endswith(C10D_FILE)


def rendezvous_frame(thread: ThreadStack) -> StackFrame | None:
    """The outermost frame of torch.distributed's setup (``init_process_group``,
    ``new_group``, the rendezvous handlers) the thread is inside, None when it is in none:
    such a thread waits for ranks to join, not in a collective, though its stack holds
    distributed_c10d.py frames and a store's native ones."""
    setup = [frame for frame in thread.python_frames()
             if frame.function.rsplit(".", 1)[-1] in SETUP_FUNCTIONS or
             frame.file.endswith(RENDEZVOUS_FILE)]
    return setup[-1] if setup else None


def _is_background_loop(thread: ThreadStack) -> bool:
    return any(marker in frame.function for frame in thread.frames
               for marker in BACKGROUND_LOOP_MARKERS)


def collective_frame(thread: ThreadStack) -> StackFrame | None:
    """The collective this thread is inside, None when it is in none.

    Prefers a frame named like a collective API (``all_reduce``) over any other frame of
    torch.distributed or of a process group; helper threads of a process group (their
    run loops wait all the time) are never in a collective.
    """
    if _is_background_loop(thread) or rendezvous_frame(thread) is not None:
        return None
    matches = [frame for frame in thread.frames if _is_collective(frame)]
    named = [frame for frame in matches if frame.function in COLLECTIVE_FUNCTIONS]
    return (named or matches or [None])[0]


def find_collective(samples: Sequence[StackSample]
                    ) -> tuple[ThreadStack, StackFrame, int] | None:
    """A thread stuck in a collective: (the thread in the last sample, its collective frame,
    the number of samples with a thread in a collective), or None.

    Stuck means in a collective in the last sample and in at least half of the samples: a
    process that passes through collectives while doing other work is not waiting in one.
    """
    if not samples:
        return None
    hits = [[(thread, frame) for thread in user_threads(sample)
             if (frame := collective_frame(thread)) is not None] for sample in samples]
    count = sum(1 for found in hits if found)
    if not hits[-1] or 2 * count < len(samples):
        return None
    thread, frame = hits[-1][0]
    return thread, frame, count


def _is_wait(frame: StackFrame) -> bool:
    return bool(WAIT_FUNCTION.search(frame.function))


def wait_frame(thread: ThreadStack) -> StackFrame | None:
    """The frame this thread waits in on a lock or condition, None when it is not waiting.

    The innermost Python frame that is a wait (``acquire``, ``wait``) or whose source line
    blocks (``lock.acquire()``, ``with lock:``) wins; otherwise the innermost native wait
    (``futex``, ``pthread_cond_wait``, ``PyThread_acquire_lock_timed``).
    """
    python = thread.python_frames()
    for frame in python:
        if _is_wait(frame) or (frame.code and WAIT_CODE.search(frame.code)):
            return frame
    native = [frame for frame in thread.frames if frame.is_native and _is_wait(frame)]
    return native[0] if native else None


INSTRUMENTATION_PATH = re.compile(r"/nsadiag/probes/efficiency\.py$|"
                                  r"/torch/utils/(flop_counter|_python_dispatch)\.py$")
"""Files of nsadiag's work count (a dispatch mode over a trial's first forward): frames
inside them, and the op calls they make, stand between the model's code and its op."""
DISPATCH_PLUMBING = re.compile(r"/torch/(_dynamo/eval_frame|_compile|_ops)\.py$")
"""torch's frames that carry an op into a dispatch mode, just outside the mode's frame."""


def _innermost_python_index(thread: ThreadStack) -> int | None:
    """Index of the innermost Python frame that is not the work count's dispatch mode or
    an op it forwards (frames are innermost first)."""
    counted = [i for i, frame in enumerate(thread.frames) if not frame.is_native
               and INSTRUMENTATION_PATH.search(frame.file or "")]
    start = counted[-1] + 1 if counted else 0
    while counted and start < len(thread.frames) and not thread.frames[start].is_native \
            and DISPATCH_PLUMBING.search(thread.frames[start].file or ""):
        start += 1
    for index in range(start, len(thread.frames)):
        if not thread.frames[index].is_native:
            return index
    return None


def innermost_python(thread: ThreadStack) -> tuple[StackFrame | None, bool]:
    """The innermost Python frame of a thread and whether native frames sit below it."""
    index = _innermost_python_index(thread)
    if index is None:
        return None, bool(thread.frames)
    return thread.frames[index], index > 0


def busy_threads(sample: StackSample) -> list[ThreadStack]:
    """Threads py-spy saw running; when it saw none running (a loaded machine's run queue
    held them all), those not blocked in a wait; all of them when every one waits.
    nsadiag's own threads (the sampler reading the stack, ...) are never among them."""
    threads = user_threads(sample)
    active = [thread for thread in threads if thread.active]
    if active:
        return active
    working = [thread for thread in threads if wait_frame(thread) is None]
    return working or threads


def _signature(sample: StackSample, python_only: bool) -> tuple:
    """Every thread's frames as comparable keys, independent of thread order (nsadiag's
    own threads left out: the sampler moves while the user's code stands still)."""
    per_thread = []
    for thread in user_threads(sample):
        frames = thread.python_frames() if python_only else thread.frames
        keys = tuple((frame.function, frame.file, frame.line) for frame in frames)
        per_thread.append((thread.thread_id, keys))
    return tuple(sorted(per_thread))


def stacks_change(samples: Sequence[StackSample], python_only: bool = False) -> bool:
    """True when any two samples differ in any thread's frames (function, file, line).
    Samples with native frames are compared with samples without by their Python frames
    only (a native sample of a frozen process differs from a nonblocking one by those),
    and with each other by all their frames."""
    if len({sample.native for sample in samples}) > 1:
        native = [sample for sample in samples if sample.native]
        return len({_signature(sample, True) for sample in samples}) > 1 or \
            (not python_only and len({_signature(sample, False) for sample in native}) > 1)
    signatures = {_signature(sample, python_only) for sample in samples}
    return len(signatures) > 1


def cpu_fraction(samples: Sequence[StackSample]) -> float | None:
    """CPU seconds per wall second between the first and last sample with a CPU reading."""
    timed = [sample for sample in samples if sample.cpu_seconds is not None]
    if len(timed) < 2 or timed[-1].t <= timed[0].t:
        return None
    return (timed[-1].cpu_seconds - timed[0].cpu_seconds) / (timed[-1].t - timed[0].t)


def _time_in_the_interpreter(samples: Sequence[StackSample]) -> bool | None:
    """Whether native samples show the running threads executing Python itself, None when
    no sample has native frames.

    py-spy replaces CPython's evaluation frames by the Python frames they run, so a thread
    executing Python has no native frame (or only CPython's own) under its innermost
    Python frame, while one inside a native op has that op's library there.
    """
    verdicts = []
    for sample in samples:
        if not sample.native:
            continue
        for thread in busy_threads(sample):
            index = _innermost_python_index(thread)
            if index is None:
                continue
            under = thread.frames[index - 1] if index else None
            verdicts.append(under is None or bool(INTERPRETER_MODULE.search(under.file)) and
                            not BUILTIN_MODULE_CALL.match(under.function))
    return all(verdicts) if verdicts else None


def native_call(samples: Sequence[StackSample]) -> str | None:
    """The native function right under the innermost Python frame of the busy threads, when
    every sample with native frames shows the same one (``_sre_SRE_Pattern_fullmatch``, an
    op of a C extension); None otherwise."""
    found = set()
    for sample in samples:
        if not sample.native:
            continue
        for thread in busy_threads(sample):
            index = _innermost_python_index(thread)
            if index:
                found.add(thread.frames[index - 1].function)
    return found.pop() if len(found) == 1 else None


def classify(samples: Sequence[StackSample]) -> str:
    """What several samples of one process show: "in-collective", "waiting",
    "busy-python" or "busy-native".

    - in-collective: a thread sits in a collective (see ``find_collective``).
    - waiting: CPU rose by less than ``IDLE_CPU_FRACTION`` of the time between samples, or,
      with no CPU readings, identical stacks with a lock/condition wait in them.
    - busy-python: Python frames change between samples, or native samples show nothing
      but CPython under the innermost Python frame.
    - busy-native: CPU rises (or is unknown) while the Python frames stay put: the time is
      spent in a native call under that line (native samples show its library there). A
      single-line Python loop sampled without native frames looks the same.
    Raises ValueError for no samples.
    """
    if not samples:
        raise ValueError("classify: no samples")
    if find_collective(samples) is not None:
        return "in-collective"
    fraction = cpu_fraction(samples)
    if fraction is not None and fraction < IDLE_CPU_FRACTION:
        return "waiting"
    if stacks_change(samples, python_only=True):
        return "busy-python"
    if fraction is None and all(any(wait_frame(t) for t in s.threads) for s in samples):
        return "waiting"
    return "busy-python" if _time_in_the_interpreter(samples) else "busy-native"


def stack_signature(sample: StackSample) -> str:
    """The innermost Python frame of each busy-or-main thread: what clusters ranks."""
    parts = []
    for thread in user_threads(sample):
        frame, _ = innermost_python(thread)
        if frame is not None and (thread.active or thread.name == "MainThread"):
            parts.append(frame.where())
    return " | ".join(sorted(parts)) or "no Python frame"


T = TypeVar("T")


def odd_ones_out(items: Sequence[T], signature: Callable[[T], str]) -> list[T]:
    """The items whose (non-empty) stack signature no other item shares, when at least two
    others agree on one: the odd rank(s) out of a cluster of identical stacks."""
    counts = Counter(signature(item) for item in items if signature(item))
    if len(counts) < 2 or max(counts.values()) < 2:
        return []
    return [item for item in items if signature(item) and counts[signature(item)] == 1]


def hot_frame(samples: Sequence[StackSample]) -> tuple[StackFrame, int, bool] | None:
    """The most common innermost frame over the running threads of all samples.

    Each running thread (py-spy's ``active``; all threads when none runs) contributes its
    innermost Python frame, or its innermost frame when it has no Python one. Frames count
    as the same by function and file; the line reported is their most common line.
    Returns (frame, occurrences, native frames sat below it in any occurrence), or None
    when no sample has a frame.
    """
    seen: list[tuple[StackFrame, bool]] = []
    for sample in samples:
        for thread in busy_threads(sample):
            frame, below = innermost_python(thread)
            if frame is None and thread.frames:
                frame, below = thread.frames[0], False
            if frame is not None:
                seen.append((frame, below))
    if not seen:
        return None
    keys = Counter((frame.function, frame.file) for frame, _ in seen)
    (function, file), count = keys.most_common(1)[0]
    same = [(frame, below) for frame, below in seen if (frame.function, frame.file) ==
            (function, file)]
    line = Counter(frame.line for frame, _ in same).most_common(1)[0][0]
    frame = next(frame for frame, _ in same if frame.line == line)
    return frame, count, any(below for _, below in same)


def user_frame(samples: Sequence[StackSample]) -> tuple[StackFrame, int] | None:
    """The most common innermost frame of the user's own code (not the standard library,
    not an installed package, not nsadiag's trial harness) over the running threads of
    ``samples`` (StackSample objects), with its count; None when no sample shows one —
    e.g. a backward pass, whose Python stack ends in the autograd engine."""
    seen = []
    for sample in samples:
        for thread in busy_threads(sample):
            own = [f for f in thread.frames if not f.is_native and f.file
                   and not LIBRARY_PATH.search(f.file) and "/nsadiag/" not in f.file]
            if own:
                seen.append(own[0])  # frames are innermost first
    if not seen:
        return None
    (function, file), count = Counter((f.function, f.file) for f in seen).most_common(1)[0]
    same = [f for f in seen if (f.function, f.file) == (function, file)]
    line = Counter(f.line for f in same).most_common(1)[0][0]
    return next(f for f in same if f.line == line), count


def own_code(frame: StackFrame) -> bool:
    """A Python frame of the user's own code: not the standard library, not an installed
    package, not nsadiag itself."""
    return (not frame.is_native and bool(frame.file) and not LIBRARY_PATH.search(frame.file)
            and "/nsadiag/" not in frame.file)


def threads_that_matter(sample: StackSample) -> list[ThreadStack]:
    """The threads of a sample worth showing: the main thread, every thread py-spy saw
    running, and every thread with a frame of the user's own code (a worker blocked on a
    lock it shares with the main thread shows here). Idle threads that only sit in library
    or nsadiag code (pool workers, the heartbeat, the sampler) are left out. Keeps the
    sample's order; the first thread stands for the main one when none is named so."""
    named = any(thread.name == "MainThread" for thread in sample.threads)
    return [thread for i, thread in enumerate(sample.threads)
            if thread.name == "MainThread" or (not named and i == 0) or
            (not nsadiag_thread(thread) and
             (thread.active or any(own_code(frame) for frame in thread.frames)))]


WORKER_LOOP = ("_worker_loop", "torch/utils/data/_utils/worker.py")
"""torch's DataLoader worker loop: a worker's own work is what runs inside it."""


def main_thread(sample: StackSample) -> ThreadStack | None:
    """The thread named MainThread (in a faulthandler dump, the one whose outermost frame
    is a module's top level: nsadiag.probes.stacks), else the first thread; None for a
    sample without threads."""
    named = [thread for thread in sample.threads if thread.name == "MainThread"]
    return named[0] if named else (sample.threads[0] if sample.threads else None)


def own_work_frame(thread: ThreadStack) -> StackFrame | None:
    """The innermost frame of the user's own code in the work a thread does now: inside a
    DataLoader worker's loop only (a forked worker's stack still holds the frames of the
    parent that forked it, below the loop), else anywhere; None when there is none."""
    frames = thread.frames
    loop = next((i for i, frame in enumerate(frames)
                 if frame.function.rsplit(".", 1)[-1] == WORKER_LOOP[0] and
                 frame.file.endswith(WORKER_LOOP[1])), None)
    inside = frames[:loop] if loop is not None else frames
    return next((frame for frame in inside if own_code(frame)), None)


def describe_place(sample: StackSample) -> dict[str, Any] | None:
    """Where a process's main thread is, in the user's terms: {"state": "waits" or
    "runs", "frame": the wait frame or the innermost frame, "where", "code", "own": the
    innermost frame of the user's own code in its work ("where" string or None)}; None
    for a sample without threads."""
    thread = main_thread(sample)
    if thread is None:
        return None
    waiting = wait_frame(thread)
    frame = waiting or innermost_python(thread)[0] or (thread.frames[0] if thread.frames
                                                       else None)
    own = own_work_frame(thread)
    if frame is None:
        return None
    return {"state": "waits" if waiting is not None else "runs", "where": frame.where(),
            "code": frame.code, "own": own.where() if own else None,
            "own_code": own.code if own else None}


def place_sentence(place: dict[str, Any]) -> str:
    """"waits in TokenDataset.__getitem__ (data.py:43) `with self.lock:`", naming the
    user's own frame the wait or work sits under when that is another frame."""
    code = f" `{place['code']}`" if place.get("code") else ""
    sentence = f"{place['state']} in {place['where']}{code}"
    if place.get("own") and place["own"] != place["where"]:
        own_code_text = f" `{place['own_code']}`" if place.get("own_code") else ""
        sentence += f", under {place['own']}{own_code_text}"
    return sentence


POOL_FILE = re.compile(r"/multiprocessing/pool\.py$")


def is_pool_worker_loop(frame: StackFrame) -> bool:
    """Whether ``frame`` is a multiprocessing pool worker's loop (``pool.worker``)."""
    return bool(POOL_FILE.search(frame.file)) and frame.function.rsplit(".", 1)[-1] == "worker"


def pool_worker_thread(sample: StackSample) -> ThreadStack | None:
    """The thread of a process that runs a multiprocessing pool worker's loop; None when the
    process is no pool worker."""
    return next((thread for thread in sample.threads
                 if any(is_pool_worker_loop(frame) for frame in thread.python_frames())), None)


FUTURE_RESULT = re.compile(r"/concurrent/futures/_base\.py$")
INDUCTOR_ASYNC = re.compile(r"/torch/_inductor/(async_compile|codecache)\.py$")
EXECUTOR_WORKER = re.compile(r"/concurrent/futures/(process|thread)\.py$")
EXECUTOR_IDLE = re.compile(r"/multiprocessing/(queues|connection|synchronize)\.py$|"
                           r"/(queue|threading|selectors)\.py$")
"""The files a worker of a concurrent.futures executor stands in while it waits for a job."""


def awaits_inductor_job(thread: ThreadStack) -> bool:
    """Whether ``thread`` waits for the result of a job torch.compile's inductor gave its
    compile workers (``Future.result`` called from async_compile.py or codecache.py)."""
    files = [frame.file for frame in thread.python_frames()]
    return any(FUTURE_RESULT.search(f) for f in files) and \
        any(INDUCTOR_ASYNC.search(f) for f in files)


def executor_job(thread: ThreadStack) -> bool | None:
    """Whether a thread that runs a concurrent.futures executor's worker loop
    (``_process_worker`` or ``_worker``) is inside a job: True inside one, False while it
    waits for one, None when the thread runs no such loop."""
    for index, frame in enumerate(thread.python_frames()):  # innermost first
        if EXECUTOR_WORKER.search(frame.file) and \
                frame.function.rsplit(".", 1)[-1] in ("_process_worker", "_worker"):
            inner = thread.python_frames()[:index]
            return any(not EXECUTOR_IDLE.search(f.file) for f in inner)
    return None
