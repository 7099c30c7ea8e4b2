"""The wait chain's model (pure): a hop, a chain, one process and one waiting thread as
the families read them, and the helpers that word a hop.

A ``WaitChain`` is a few ``Hop``s, first the waiting thread, and an end: the way it ends
(one of the ends a family of ``nsadiag.verdict.waits`` declares), from which the next step
is said. A ``Waiting`` is what every family is asked about: the thread, its process, the
other processes of the job sampled at the stall, how deep the chain already is, and how to
follow another thread (``follow``: the registry's walk, handed in so that a family that
leads to another thread or process continues there without importing the registry).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, NamedTuple, Protocol

from nsadiag.evidence import StackFrame, StackSample, ThreadStack
from nsadiag.probes.compiler import compiler_frame
from nsadiag.probes.frames import own_code, user_threads, wait_frame
from nsadiag.waitfacts import READ_SYSCALLS, OpenFile, ProcessWaits, ThreadWait

HOPS = ("lock", "holder", "queue", "join", "pool", "producer", "child", "pipe", "file-lock",
        "future",
        "terminal", "sleep", "process",
        "worker", "poll", "socket", "peer", "collective", "frame", "ended", "compile-pool",
        "barrier", "rendezvous", "unknown")


MAX_DEPTH = 3
"""Threads followed one from another (a join of a thread that joins another ...)."""
QUEUE_CODE = re.compile(r"([\w.\[\]]+)\.(get|put|wait|join)\(")
SUBPROCESS = re.compile(r"/subprocess\.py$")
THREADING = re.compile(r"/threading\.py$")
TORCH_FILE = re.compile(r"/torch/")
CPP_BUILD = re.compile(r"torch/_inductor/cpp_builder\.py$")


@dataclass(frozen=True)
class Hop:
    """One link: its kind (``HOPS``), the sentence, and the line it stands at."""

    kind: str
    text: str
    where: str | None = None
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "where": self.where, "code": self.code}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hop:
        return cls(str(data["kind"]), str(data["text"]), data.get("where"), data.get("code"))


@dataclass(frozen=True)
class WaitChain:
    """The hops, first the waiting thread; ``end`` (an end of a family of
    nsadiag.verdict.waits, ``ENDS``) and ``subject``: the lock, queue, path, command or
    condition the end is about."""

    hops: tuple[Hop, ...]
    end: str
    subject: str | None = None

    def has(self, kind: str) -> bool:
        return any(hop.kind == kind for hop in self.hops)

    def printed(self) -> str:
        """"waits for X at f:l -> X is held by Y -> Y is doing Z at f:l"."""
        return " -> ".join(hop.text for hop in self.hops)

    def to_dict(self) -> dict[str, Any]:
        return {"hops": [hop.to_dict() for hop in self.hops], "end": self.end,
                "subject": self.subject, "printed": self.printed()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WaitChain:
        return cls(tuple(Hop.from_dict(h) for h in data.get("hops") or ()), str(data["end"]),
                   data.get("subject"))


@dataclass(frozen=True)
class Proc:
    """One process as the chain reads it: its last sample, OS waits, exceptions, role."""

    sample: StackSample
    waits: ProcessWaits | None
    died: tuple[dict[str, Any], ...] = ()
    role: str = "this process"
    forked: bool = False


class Follow(Protocol):
    """The registry's walk: the chain from ``thread`` of ``process``."""

    def __call__(self, process: Proc, thread: ThreadStack, others: Sequence[Proc],
                 depth: int = 0) -> WaitChain: ...


@dataclass(frozen=True)
class Waiting:
    """One waiting thread as every family is asked about it: its process, the other
    processes sampled at the stall, the threads already followed to reach it (``depth``),
    the registry's walk (``follow``), and what is read once for every family: its waiting
    frame (``frame``), its innermost frame of the user's (``own``), the kernel's word on it
    (``os_wait``) and the child whose output pipe it reads (``writer``)."""

    process: Proc
    thread: ThreadStack
    others: Sequence[Proc]
    depth: int
    follow: Follow
    frame: StackFrame | None
    own: StackFrame | None
    os_wait: ThreadWait | None
    writer: ProcessWaits | None

    @classmethod
    def of(cls, process: Proc, thread: ThreadStack, others: Sequence[Proc], depth: int,
           follow: Follow) -> Waiting:
        os_wait = os_wait_of(process.waits, thread)
        return cls(process, thread, others, depth, follow, wait_frame(thread),
                   own_frame(thread), os_wait, pipe_writer(process.waits, os_wait))


class End(NamedTuple):
    """One way a chain ends: what it means, and the sentence of what to change there
    (None: the end names no cause, or another verdict's sentence says it)."""

    meaning: str
    advice: Callable[[WaitChain], str | None]


@dataclass(frozen=True)
class Family:
    """One family of waits: its name, how it reads a waiting thread (``follow``: its chain,
    or None when the thread's wait is not of this family; None for a family whose chains
    are built where their evidence is read, a stopped process or a job's ranks) and the
    ends its chains have, each with its advice."""

    name: str
    follow: Callable[[Waiting], WaitChain | None] | None
    ends: Mapping[str, End]


def at(frame: StackFrame) -> str:
    """"file.py:52" of a frame."""
    return f"{PurePath(frame.file).name}:{frame.line}"


def at_scope(name: str, line: int) -> str:
    return f"{PurePath(name).name}:{line}"


def label(thread: ThreadStack) -> str:
    return "the main thread" if thread.name == "MainThread" else \
        f"thread {thread.name or thread.thread_id}"


def own_frame(thread: ThreadStack) -> StackFrame | None:
    return next((frame for frame in thread.frames if own_code(frame)), None)


def os_wait_of(waits: ProcessWaits | None, thread: ThreadStack) -> ThreadWait | None:
    if waits is None:
        return None
    return waits.thread(thread.os_thread_id) or (
        waits.thread(waits.pid) if thread.name == "MainThread" else None)


def doing(thread: ThreadStack, process: Proc) -> Hop:
    """What a thread that is not waiting on the first one does: its own line."""
    frame = own_frame(thread) or (thread.python_frames() or [None])[0]
    if frame is None:
        return Hop("unknown", f"{label(thread)}: where it stands is unknown (no frames)")
    code = f" `{frame.code}`" if frame.code else ""
    state = "waits at" if wait_frame(thread) is not None else "runs"
    return Hop("frame", f"{label(thread)} {state} {at(frame)}{code}", at(frame), frame.code)


def strip_label(text: str, thread: ThreadStack) -> str:
    return text.removeprefix(label(thread) + " ")


def main_thread(sample: StackSample) -> ThreadStack | None:
    threads = user_threads(sample)
    return next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)


def start_thread(sample: StackSample) -> ThreadStack | None:
    """The thread the chain starts from: the main thread when it waits or is the only
    one, else the first user thread that waits."""
    threads = user_threads(sample)
    waiting = [t for t in threads if wait_frame(t) is not None]
    main = next((t for t in threads if t.name == "MainThread"), None)
    if main is not None and (wait_frame(main) is not None or not waiting):
        return main
    return (waiting or threads or [None])[0]


def command_of(waits: ProcessWaits) -> str:
    return " ".join(waits.command) or f"pid {waits.pid}"


def short_command(argv: Sequence[str]) -> str:
    """A command as a person names it: each path by its last part ("python serve.py 80"
    for "/venv/bin/python /home/u/serve.py 80")."""
    return " ".join(PurePath(arg).name if "/" in arg and not arg.endswith("/") else arg
                    for arg in argv)


def read_file(waits: ProcessWaits | None, os_wait: ThreadWait | None) -> OpenFile | None:
    """The open file a thread blocked in a read is reading; None when it is not in one."""
    if waits is None or os_wait is None or os_wait.syscall_name not in READ_SYSCALLS:
        return None
    return waits.file(os_wait.first_arg)


def pipe_writer(waits: ProcessWaits | None, os_wait: ThreadWait | None
                 ) -> ProcessWaits | None:
    """The child holding the write end of the pipe the thread is blocked reading (its
    output, which the thread reads to the end); None when the read is not of such a pipe."""
    read = read_file(waits, os_wait)
    if waits is None or read is None or not read.is_pipe:
        return None
    return next((child for child in waits.children
                 if any(f.inode == read.inode and "w" in f.mode for f in child.files)), None)


def in_compile(thread: ThreadStack) -> tuple[str, bool] | None:
    """Where torch.compile stands in ``thread`` (" inside torch.compile (f at file:line)",
    its innermost torch frame) and whether that is its C++ build; None when the thread is
    not compiling."""
    frames = thread.python_frames()  # innermost first
    cxx = any(CPP_BUILD.search(f.file) for f in frames)
    if compiler_frame((f.function, f.file, f.line) for f in reversed(frames)) is None:
        # a compile worker (process or thread) runs the C++ build with none of the
        # compiler's entry frames on its stack
        build = next((f for f in frames if CPP_BUILD.search(f.file)), None)
        return (f" in torch.compile's C++ build ({build.function} at {at(build)})", True) \
            if build is not None else None
    inner = next((f for f in frames if TORCH_FILE.search(f.file)), None)
    if inner is None:
        return None
    return f" inside torch.compile ({inner.function} at {at(inner)})", cxx


def continued(first: Hop | None, inner: WaitChain, head: str,
              unknown: str | None = None) -> WaitChain:
    """The chain that goes on into another thread or process: ``first`` (None: none), then
    ``inner`` with its head hop said as ``head`` (naming the process or worker it is in);
    an ``inner`` that ends unknown ends as ``unknown`` instead when given (the line the
    worker stands at is then itself the end)."""
    was = inner.hops[0]
    hops = (*((first,) if first is not None else ()), Hop(was.kind, head, was.where, was.code),
            *inner.hops[1:])
    end = unknown if unknown is not None and inner.end == "unknown" else inner.end
    return WaitChain(hops, end, inner.subject)


def said_at(chain: WaitChain, index: int) -> str:
    """" at file:line" of the chain's hop ``index`` ("" when it has no line)."""
    hops = chain.hops
    if not -len(hops) <= index < len(hops) or not hops[index].where:
        return ""
    return f" at {hops[index].where}"


def hop_of(chain: WaitChain, kind: str) -> int:
    """The index of the chain's first hop of ``kind`` (0 when it has none): where a family's
    own wait stands when the chain reached it from another thread or process."""
    return next((i for i, hop in enumerate(chain.hops) if hop.kind == kind), 0)


def called_at(chain: WaitChain) -> str:
    """" (called at file:line)" of the chain's first hop ("" when it has no line)."""
    where = said_at(chain, 0)
    return f" (called{where})" if where else ""

