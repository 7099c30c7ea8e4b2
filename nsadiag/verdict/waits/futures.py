"""Futures: a wait for a ``concurrent.futures`` future's result (asyncio's
``run_coroutine_threadsafe`` gives one too).

On the thread that runs the asyncio event loop the loop that would run the coroutine is the
one waiting; else the thread pool's workers: all taken by tasks that wait for futures
themselves is starvation, and the one running a task is followed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.probes.frames import user_threads
from nsadiag.verdict.waits.model import (
    MAX_DEPTH,
    THREADING,
    End,
    Family,
    Follow,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    doing,
    label,
    own_frame,
    said_at,
)

FUTURE_FILE = re.compile(r"concurrent/futures/_base\.py$")
EXECUTOR_WORKER_FILE = re.compile(r"concurrent/futures/thread\.py$")
EVENT_LOOP_FILE = re.compile(r"asyncio/(?:events|base_events)\.py$")
QUEUE_FILE = re.compile(r"/queue\.py$")


def _awaits_future(thread: ThreadStack) -> bool:
    """Whether the thread waits in ``concurrent.futures.Future.result`` (asyncio's
    ``run_coroutine_threadsafe`` gives one too)."""
    return any(FUTURE_FILE.search(f.file) and f.function.endswith("result")
               for f in thread.python_frames())


def _executor_worker(thread: ThreadStack) -> bool:
    """Whether the thread is a worker of a ``ThreadPoolExecutor`` (its ``_worker`` loop is
    at the bottom of its stack)."""
    return any(EXECUTOR_WORKER_FILE.search(f.file) and f.function == "_worker"
               for f in thread.python_frames())


def _pool_name(thread: ThreadStack) -> str:
    """The pool a worker belongs to, by its thread name ("ThreadPoolExecutor-0_1" is worker
    1 of pool "ThreadPoolExecutor-0"; a thread_name_prefix names it its own way)."""
    name = thread.name or ""
    return name.rsplit("_", 1)[0] if "_" in name else name or "the pool"


def _idle_worker(thread: ThreadStack) -> bool:
    """A pool worker with no task: waiting for the next work item in its queue."""
    python = [f for f in thread.python_frames() if not THREADING.search(f.file)]
    return bool(python) and (QUEUE_FILE.search(python[0].file) is not None or
                             EXECUTOR_WORKER_FILE.search(python[0].file) is not None)


def _future_chain(follow: Follow, process: Proc, thread: ThreadStack, own: StackFrame | None,
                  others: Sequence[Proc], depth: int) -> WaitChain:
    """A wait for a future's result: on the thread that runs the asyncio event loop (the
    loop that would run the coroutine is the one waiting); else the thread pool's workers,
    all taken by tasks that wait for futures themselves (starvation), or the one running a
    task, followed."""
    where = at(own) if own is not None else None
    first = Hop("future", f"{label(thread)} waits for a future's result" +
                (f" at {where}" if where else ""), where, own.code if own else None)
    if any(EVENT_LOOP_FILE.search(f.file) for f in thread.python_frames()):
        return WaitChain((first, Hop(
            "holder", f"{label(thread)} is the thread that runs the asyncio event loop "
                      f"(its stack holds the loop's own frames below this wait): the "
                      f"coroutine behind the future needs that loop, which is blocked in "
                      f"this wait")), "loop-self", where)
    workers = [t for t in user_threads(process.sample)
               if t is not thread and _executor_worker(t)]
    if _executor_worker(thread):  # a task waiting inside its own pool: that pool's workers
        workers = [t for t in workers if _pool_name(t) == _pool_name(thread)] + [thread]
    if not workers:
        return WaitChain((first, Hop("unknown", "no thread pool worker of this process runs "
                                                "the task it waits for")), "unknown")
    busy = [t for t in workers if not _idle_worker(t)]
    if busy and all(_awaits_future(t) for t in busy) and len(busy) == len(workers):
        names = ", ".join(t.name or str(t.thread_id) for t in busy)
        inner = next((o for t in busy if t is not thread and (o := own_frame(t)) is not None),
                     None) or own
        pool = _pool_name(busy[0])
        return WaitChain((first, Hop(
            "pool", f"every worker of {pool} ({len(busy)}: {names}) runs a task that itself "
                    f"waits for a future" + (f" at {at(inner)}" if inner else "") +
                    ": the tasks they wait for are queued behind them in the same pool, "
                    "and no worker is left to run them", at(inner) if inner else None,
                    inner.code if inner else None)), "pool-starved", pool)
    running = next((t for t in busy if not _awaits_future(t)), None)
    if running is not None and depth < MAX_DEPTH:
        step = doing(running, process)
        rest = follow(process, running, others, depth + 1)
        if rest.end != "unknown":
            return WaitChain((first, Hop("pool", f"{step.text} (a worker of "
                                                 f"{_pool_name(running)})", step.where,
                                         step.code), *rest.hops), rest.end, rest.subject)
        return WaitChain((first, Hop("pool", f"{step.text} (a worker of "
                                             f"{_pool_name(running)}): the task, still "
                                             f"running", step.where, step.code)),
                         "executor-task", _pool_name(running))
    return WaitChain((first, Hop("unknown", "no worker of the pool runs a task: the task "
                                            "this future stands for is not running")),
                     "unknown")


def _follow(waiting: Waiting) -> WaitChain | None:
    if waiting.frame is None or not _awaits_future(waiting.thread):
        return None
    return _future_chain(waiting.follow, waiting.process, waiting.thread, waiting.own,
                         waiting.others, waiting.depth)


def _loop_self(chain: WaitChain) -> str:
    return (f"Do not block the event loop's own thread on a future{said_at(chain, 0)}: "
            f"in async code `await` the coroutine (or `await asyncio.wrap_future(fut)`), "
            f"and call `run_coroutine_threadsafe(...).result()` only from another "
            f"thread.")


def _pool_starved(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Do not wait inside a task of `{subject}` for another task of the same pool"
            f"{said_at(chain, -1)}: every worker is taken by such a wait. Do the inner "
            f"work directly in the task (no `submit`), give it a pool of its own, or make "
            f"`max_workers` larger than the tasks that can wait at once.")


def _executor_task(chain: WaitChain) -> str:
    return (f"The task of the thread pool `{chain.subject}` this waits for stands"
            f"{said_at(chain, -1)} and "
            f"never returns: make that line return (call its function once directly to see "
            f"it alone), or wait with `future.result(timeout=...)`{said_at(chain, 0)} so that "
            f"a task that hangs fails the wait.")


FAMILY = Family("futures", _follow, {
    "executor-task": End("a worker of a thread pool runs the task the future stands for and "
                         "stands at its frame, not in a wait of a known kind", _executor_task),
    "loop-self": End("a thread that runs the asyncio event loop waits for a future whose "
                     "coroutine needs that loop (``run_coroutine_threadsafe(...).result()`` "
                     "on the loop's own thread)", _loop_self),
    "pool-starved": End("every worker of a thread pool runs a task that waits for another "
                        "future, so the tasks they wait for never get a worker",
                        _pool_starved),
})
