"""Thread pools a fork did not copy: a thread of a process forked without an exec that
waits (on a futex, using no CPU) inside one of torch's ops.

A fork copies only the thread that called it. torch's intra-op thread pool (OpenMP on most
CPU builds) keeps, in the copy, the state it had in the parent, whose threads did not come
along: the copy's next parallel op waits for them forever.
"""

from __future__ import annotations

from nsadiag.verdict.waits.model import (
    TORCH_FILE,
    End,
    Family,
    Hop,
    WaitChain,
    Waiting,
    at,
    label,
    said_at,
)

FUTEX = ("futex", "futex_wait", "futex_do_wait", "futex_wait_queue")


def _follow(waiting: Waiting) -> WaitChain | None:
    process, thread, own = waiting.process, waiting.thread, waiting.own
    frames = thread.python_frames()  # innermost first
    if not process.forked or not frames or not TORCH_FILE.search(frames[0].file) or \
            own is None:
        return None
    os_wait = waiting.os_wait
    if os_wait is not None and (os_wait.wchan or "").split(".")[0] not in FUTEX and \
            os_wait.syscall_name != "futex":
        return None
    inner = frames[0]
    pid = process.sample.pid
    who = f"pid {pid}" if process.role.startswith("pid ") else f"{process.role} (pid {pid})"
    code = f" `{own.code}`" if own.code else ""
    return WaitChain((Hop("frame", f"{label(thread)} waits inside torch's {inner.function} "
                                   f"({at(inner)}), called at {at(own)}{code}", at(own),
                          own.code),
                      Hop("pool", f"{who} was forked without an exec: torch's "
                                  f"intra-op thread pool is not copied by a fork, and the "
                                  f"op waits for pool threads the copy does not have")),
                     "fork-thread-pool", at(own))


def _fork_thread_pool(chain: WaitChain) -> str:
    return (f"Start the child with the spawn start method "
            f"(`multiprocessing.get_context(\"spawn\")`), or call `torch.set_num_threads(1)` "
            f"in the child before its first op{said_at(chain, -2)}: a fork copies only the "
            f"thread that called it, and the op waits for the parent's pool threads.")


FAMILY = Family("thread pools lost in a fork", _follow, {
    "fork-thread-pool": End("a forked copy waits inside one of torch's ops for the intra-op "
                            "pool threads the fork did not copy", _fork_thread_pool),
})
