"""Waits for a future's result followed to what could release it: the asyncio event loop
that is the waiting thread itself, and a thread pool whose every worker waits for a future
of its own (starvation); a worker that runs its task is followed as a thread of its own."""

from __future__ import annotations

from nsadiag.finding.next_step import chain_next
from nsadiag.verdict.chain import wait_chain
from nsadiag.waitfacts import ProcessWaits
from tests.nsadiag.verdict.test_wait_chain import evidence, frame, roundtrip, thread

LIB = "/usr/lib/python3.11"
RESULT = frame("Future.result", 451, "self._condition.wait(timeout)",
               f"{LIB}/concurrent/futures/_base.py")
COND = frame("Condition.wait", 327, "waiter.acquire()", f"{LIB}/threading.py")
WORKER_LOOP = frame("_worker", 83, "work_item.run()", f"{LIB}/concurrent/futures/thread.py")
IDLE = frame("Queue.get", 171, "self.not_empty.wait()", f"{LIB}/queue.py")


def test_a_future_waited_for_on_the_event_loops_own_thread_is_the_loop_waiting_for_itself():
    main = thread(100, "MainThread", COND, RESULT,
                  frame("load_sync", 7, "return asyncio.run_coroutine_threadsafe(fetch(), "
                        "loop).result()"),
                  frame("main", 10, "w = load_sync(loop)"),
                  frame("Handle._run", 80, "self._context.run(self._callback, *self._args)",
                        f"{LIB}/asyncio/events.py"))
    chain = roundtrip(wait_chain(evidence([main], ProcessWaits(100, ()))))
    assert chain.end == "loop-self"
    assert chain.printed().startswith("the main thread waits for a future's result at "
                                      "train.py:7 -> the main thread is the thread that runs "
                                      "the asyncio event loop")
    said = chain_next(chain)
    assert said.startswith("Do not block the event loop's own thread on a future at "
                           "train.py:7") and "`await`" in said


def test_a_pool_whose_every_worker_waits_for_a_future_is_starved():
    main = thread(100, "MainThread", COND, RESULT,
                  frame("<module>", 10, "batch = pool.submit(load_batch, texts).result()"))
    worker = thread(101, "ThreadPoolExecutor-0_0", COND, RESULT,
                    frame("load_batch", 8, "return pad([f.result() for f in futures])"),
                    WORKER_LOOP)
    chain = roundtrip(wait_chain(evidence([main, worker], ProcessWaits(100, ()))))
    assert chain.end == "pool-starved" and chain.subject == "ThreadPoolExecutor-0"
    assert "every worker of ThreadPoolExecutor-0 (1: ThreadPoolExecutor-0_0) runs a task that "\
        "itself waits for a future at train.py:8" in chain.printed()
    said = chain_next(chain)
    assert "`max_workers`" in said and "train.py:8" in said


def test_a_worker_running_its_task_is_followed_and_an_idle_pool_is_not_starved():
    main = thread(100, "MainThread", COND, RESULT,
                  frame("<module>", 10, "out = pool.submit(fetch).result()"))
    busy = thread(101, "ThreadPoolExecutor-0_0",
                  frame("fetch", 21, "while not os.path.exists(marker):"), WORKER_LOOP)
    idle = thread(102, "ThreadPoolExecutor-0_1", COND, IDLE, WORKER_LOOP)
    chain = roundtrip(wait_chain(evidence([main, busy, idle], ProcessWaits(100, ()))))
    assert chain.end == "executor-task" and chain.subject == "ThreadPoolExecutor-0"
    assert "thread ThreadPoolExecutor-0_0 runs train.py:21" in chain.printed()
    said = chain_next(chain)
    # the thread pool's own way to bound the wait, not multiprocessing.Pool's
    assert "`future.result(timeout=...)` at train.py:10" in said and "map_async" not in said
    only_idle = roundtrip(wait_chain(evidence([main, idle], ProcessWaits(100, ()))))
    assert only_idle.end == "unknown" and "no worker of the pool runs a task" in \
        only_idle.printed()
