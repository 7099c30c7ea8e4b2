"""torch.compile's compile workers: a wait for a job of them (``Future.result`` under
inductor's async_compile/codecache).

Inductor's compile-worker process (a child running
torch/_inductor/compile_worker/__main__.py) and the workers it forked, or the compile
threads of this process; the worker inside a job is followed (its own wait for the C++
compiler ends as compile-cxx), workers all idle are said so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.probes.frames import awaits_inductor_job, executor_job, user_threads
from nsadiag.verdict.waits.model import (
    MAX_DEPTH,
    End,
    Family,
    Follow,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    called_at,
    continued,
    in_compile,
    label,
    os_wait_of,
    said_at,
    strip_label,
)
from nsadiag.waitfacts import ProcessWaits

COMPILE_SIDECAR = re.compile(r"torch/_inductor/compile_worker/__main__\.py$")
"""The script of inductor's compile-worker process, in its command line."""


def _compile_workers(process: Proc, others: Sequence[Proc]
                     ) -> tuple[ProcessWaits | None, list[tuple[Proc, ThreadStack]]]:
    """Inductor's compile-worker process among the children of ``process`` (None when it
    has none), and the sampled processes that run a worker loop of its executor: its
    children, or any process whose command is the same script."""
    children = process.waits.children if process.waits else ()
    sidecar = next((c for c in children if any(COMPILE_SIDECAR.search(arg)
                                               for arg in c.command)), None)
    forked = {c.pid for c in sidecar.children} if sidecar is not None else set()
    workers = []
    for other in others:
        thread = next((t for t in user_threads(other.sample) if executor_job(t) is not None),
                      None)
        command = other.waits.command if other.waits else ()
        if thread is not None and (other.sample.pid in forked or
                                   any(COMPILE_SIDECAR.search(arg) for arg in command)):
            workers.append((other, thread))
    return sidecar, workers


def _compile_pool_chain(follow: Follow, process: Proc, thread: ThreadStack, own: StackFrame | None,
                        others: Sequence[Proc], depth: int) -> WaitChain:
    """A wait for a job of torch.compile's compile workers: the worker (a compile thread of
    this process, or a process inductor's compile-worker process forked) that is inside a
    job is followed; every one idle is said so."""
    compiling = in_compile(thread)
    inside = compiling[0] if compiling else ""
    where = f" at {at(own)}" if own is not None else ""
    sidecar, workers = _compile_workers(process, others)
    threads = [t for t in user_threads(process.sample) if t is not thread and
               executor_job(t) is not None]
    held = f" (inductor's compile-worker process, pid {sidecar.pid})" if sidecar else ""
    first = Hop("compile-pool", f"{label(thread)} waits for a job of torch.compile's compile "
                                f"workers{held}{inside}{where}",
                at(own) if own else None, own.code if own else None)
    busy_thread = next((t for t in threads if executor_job(t)), None)
    busy = next(((p, t) for p, t in workers if executor_job(t)), None)
    if depth < MAX_DEPTH and (busy_thread is not None or busy is not None):
        owner, runner = (process, busy_thread) if busy_thread is not None else busy
        inner = follow(owner, runner, others if owner is process else (), depth + 1)
        name = label(runner) if owner is process else f"compile worker pid {owner.sample.pid}"
        if inner.end == "unknown":  # no wait of a known kind: where its job stands
            return WaitChain((first, _job_hop(owner, runner, name)), "compile-worker")
        return continued(first, inner, f"{name} {strip_label(inner.hops[0].text, runner)}")
    if workers or threads:
        named = ", ".join([f"pid {p.sample.pid}" for p, _ in workers] +
                          [label(t) for t in threads])
        return WaitChain((first, Hop("compile-pool", f"every compile worker sampled ({named}) "
                                                     f"waits idle for a job: none runs the one "
                                                     f"awaited")), "unknown")
    unseen = "its workers were not sampled" if sidecar else "no compile worker was found"
    return WaitChain((first, Hop("unknown", f"{unseen}: what runs the job is unknown")),
                     "unknown")


def _job_hop(process: Proc, thread: ThreadStack, name: str) -> Hop:
    """Where a compile worker's job stands: its innermost Python frame, and where the
    kernel holds the thread when /proc said."""
    frame = (thread.python_frames() or [None])[0]
    os_wait = os_wait_of(process.waits, thread)
    kernel = os_wait.wchan or os_wait.syscall_name if os_wait is not None else None
    held = f", in the kernel at {kernel}" if kernel else ""
    if frame is None:
        return Hop("frame", f"{name} is inside a job{held}")
    code = f" `{frame.code}`" if frame.code else ""
    return Hop("frame", f"{name} is inside its job at {at(frame)}{code}{held}", at(frame),
               frame.code)


def _follow(waiting: Waiting) -> WaitChain | None:
    if waiting.frame is None or not awaits_inductor_job(waiting.thread):
        return None
    return _compile_pool_chain(waiting.follow, waiting.process, waiting.thread, waiting.own,
                               waiting.others, waiting.depth)


def _compile_worker(chain: WaitChain) -> str:
    return (f"torch.compile{called_at(chain)} waits for a job its compile worker runs"
            f"{said_at(chain, -1)}, which never finishes: give the wait a timeout "
            f"(`TORCHINDUCTOR_COMPILE_WORKER_WAIT_TIMEOUT`, in seconds) so that it fails "
            f"naming the kernel instead of hanging, and run with "
            f"`TORCHINDUCTOR_COMPILE_THREADS=1` to compile in the main process, where the "
            f"job's own stack shows what it waits for.")


FAMILY = Family("compile workers", _follow, {
    "compile-worker": End("a compile worker of torch.compile (inductor's compile-worker "
                          "process or compile thread) stands at its frame in the job "
                          "awaited", _compile_worker),
})
