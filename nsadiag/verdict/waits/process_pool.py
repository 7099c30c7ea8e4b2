"""multiprocessing pools: a wait for a ``multiprocessing.Pool``'s results.

A worker that runs a task is followed; every worker idle means no worker holds the awaited
task: a pool worker that ended before the stall (nsadiag.harness.child_exits, with its exit
status as the pool read it) took it, and the workers started in its place are named.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.probes.frames import POOL_FILE, is_pool_worker_loop, own_code, pool_worker_thread
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
    continued,
    label,
    said_at,
    strip_label,
)
from nsadiag.waitfacts import EndedProcess

REPLACER = re.compile(r"\(_handle_workers\)")
POOL_WORKER_NAME = re.compile(r"PoolWorker-\d+$")
"""multiprocessing.Pool's name of its worker processes ("ForkPoolWorker-3")."""


def _runs_task(thread: ThreadStack) -> bool:
    """Whether a pool worker's loop thread is inside a task: a frame of the user's code
    inside the worker loop (a forked worker's stack also holds, outside the loop, the
    parent's frames that created the pool)."""
    for frame in thread.frames:  # innermost first
        if is_pool_worker_loop(frame):
            return False
        if own_code(frame):
            return True
    return False


def _pool_chain(follow: Follow, process: Proc, thread: ThreadStack, own: StackFrame | None,
                others: Sequence[Proc], depth: int) -> WaitChain:
    """A wait for a multiprocessing pool's results: a worker that runs a task is followed;
    every worker idle means the task is held by none (a worker that ended took it: the pool
    starts another in its place and never returns the task)."""
    where = f" at {at(own)}" if own is not None else ""
    first = Hop("pool", f"{label(thread)} waits for the results of a multiprocessing pool"
                        f"{where}", at(own) if own else None, own.code if own else None)
    workers = [(p, t) for p in others if (t := pool_worker_thread(p.sample)) is not None]
    if not workers:
        return WaitChain((first, Hop("unknown", "no worker of the pool was sampled: where "
                                                "they stand is unknown")), "unknown")
    busy = [(p, t) for p, t in workers if _runs_task(t)]
    if busy and depth < MAX_DEPTH:
        worker, loop = busy[0]
        inner = follow(worker, loop, (), depth + 1)
        return continued(first, inner, f"pool worker pid {worker.sample.pid} "
                                       f"{strip_label(inner.hops[0].text, loop)}",
                         "pool-worker")
    pids = ("pid " if len(workers) == 1 else "pids ") + \
        ", ".join(str(p.sample.pid) for p, _ in workers)
    # a worker the pool started after its first ones inherits the name of the pool's
    # thread that starts the replacements
    replaced = [p.sample.pid for p, t in workers if REPLACER.search(t.name or "")]
    lost = _lost_workers(process)
    if lost:
        return WaitChain((first, _ended_workers(lost, replaced, len(workers))),
                         "pool-worker-ended",
                         ("pool worker pid " if len(lost) == 1 else "pool workers pids ") +
                         ", ".join(str(e.pid) for e in lost))
    started = (f"; pid {', '.join(map(str, replaced))} was started by the pool's "
               f"`_handle_workers` thread, which replaces a worker that ended"
               if replaced else "")
    noun = {1: "its one worker sampled", 2: "both its workers"}.get(
        len(workers), f"all {len(workers)} of its workers")
    verb = "waits" if len(workers) == 1 else "wait"
    return WaitChain((first, Hop("pool", f"{noun} ({pids}) {verb} idle for a task: none "
                                         f"runs the task whose result this waits for"
                                         f"{started}")), "pool-lost-task")


def _lost_workers(process: Proc) -> list[EndedProcess]:
    """The pool workers of ``process`` that ended other than by finishing their tasks (a
    worker retired by ``maxtasksperchild`` exits with code 0 and loses nothing)."""
    ended = process.waits.ended if process.waits else ()
    return [e for e in ended if POOL_WORKER_NAME.search(e.name) and e.returncode != 0]


def _ended_workers(lost: Sequence[EndedProcess], replaced: Sequence[int], sampled: int
                   ) -> Hop:
    """"pool worker pid P ended (killed by SIGKILL) while it ran the task; the pool
    replaced it with pid Q, which never gets that task"."""
    said = "; ".join(f"pool worker pid {e.pid} ended ({e.status()})" for e in lost)
    one = len(lost) == 1
    task = "while it ran the task" if one else "and one of them ran the task"
    idle = "the workers it has now wait idle" if sampled > 1 else "its worker now waits idle"
    if replaced:
        them = "it" if one else "them"
        new = ", ".join(map(str, replaced))
        never = "which never gets" if len(replaced) == 1 else "which never get"
        return Hop("ended", f"{said} {task}; the pool replaced {them} with pid {new}, {never} "
                            f"that task ({idle})")
    return Hop("ended", f"{said} {task}; {idle}, and none gets that task")


def _follow(waiting: Waiting) -> WaitChain | None:
    if waiting.frame is None or not any(POOL_FILE.search(f.file)
                                        for f in waiting.thread.python_frames()):
        return None
    return _pool_chain(waiting.follow, waiting.process, waiting.thread, waiting.own,
                       waiting.others, waiting.depth)


def _pool_lost_task(chain: WaitChain) -> str:
    return (f"A worker of the pool ended while it ran a task: `multiprocessing.Pool` starts "
            f"a new worker but never returns that task's result, so the wait"
            f"{said_at(chain, 0)} never ends. Find why the worker ended (an out-of-memory "
            f"kill shows in `dmesg`), and use `concurrent.futures.ProcessPoolExecutor`, "
            f"which raises `BrokenProcessPool` when a worker dies, or "
            f"`map_async(...).get(timeout=...)`.")


def _pool_worker_ended(chain: WaitChain) -> str:
    """A pool whose worker ended while it ran the awaited task: why it ended is looked for
    where its exit status points (a SIGKILL nsadiag did not send is most often the
    kernel's out-of-memory killer)."""
    printed = chain.printed()
    why = ("a SIGKILL that nsadiag did not send is most often the kernel's out-of-memory "
           "killer (`dmesg` names the pid it killed), so give each task less to hold or run "
           "fewer workers" if "killed by SIGKILL" in printed else
           "its exit status says how: a signal is a crash or a kill, a code is an `exit` "
           "in the task or in a library it calls" if "killed by" in printed or
           "exited with code" in printed else
           "its exit status is not known, so run the task alone in the main process "
           "to see it end")
    return (f"Find why {chain.subject} ended while it ran a task: {why}. "
            f"`multiprocessing.Pool` replaces the worker but never returns that task's "
            f"result, so the wait{said_at(chain, 0)} never ends: use "
            f"`concurrent.futures.ProcessPoolExecutor`, which raises `BrokenProcessPool` "
            f"when a worker dies, or `map_async(...).get(timeout=...)`.")


def _pool_worker(chain: WaitChain) -> str:
    return (f"The pool's worker stands{said_at(chain, -1)} and never returns its task's "
            f"result: make that line return (run the function once in the main process to "
            f"see it alone), or wait with `map_async(...).get(timeout=...)`.")


FAMILY = Family("multiprocessing pools", _follow, {
    "pool-lost-task": End("every worker of a multiprocessing pool waits idle for a task "
                          "while the pool's results are awaited (the task went with a "
                          "worker that ended)", _pool_lost_task),
    "pool-worker-ended": End("the same, with the worker that ended (its pid and exit "
                             "status, or that the status is not known) named",
                             _pool_worker_ended),
    "pool-worker": End("a pool worker stands at its frame", _pool_worker),
})
