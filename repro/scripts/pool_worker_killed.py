"""Defect: a worker of the preprocessing pool is killed mid-task, and `Pool.map` waits for
its result forever.

A plain data-preparation script (no nsadiag import), as run before training: it tokenizes
a corpus with a `multiprocessing.Pool`. One document is enormous, and the worker that gets
it is killed by the kernel for memory (here the worker sends itself SIGKILL on that
document, as the out-of-memory killer would). `multiprocessing.Pool` starts a new worker
in its place, but the killed worker's task is lost: `pool.map` never returns, with no
error, no CPU used, and every worker idle.

Expected verdict: DEADLOCK at the `pool.map` line, the wait chain naming the worker that
ended (killed by SIGKILL) while it ran the task and the worker that replaced it, and the next
step to find why the worker ended and use an executor that reports it:

    nsadiag run -- python repro/scripts/pool_worker_killed.py
"""

import os
import signal
from multiprocessing import Pool

HUGE = 5  # the document that takes more memory than the node has


def tokenize(index: int) -> list[int]:
    if index == HUGE:
        os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
    text = f"document {index} " * 50
    return [len(word) for word in text.split()]


def main() -> None:
    with Pool(2) as pool:
        tokens = pool.map(tokenize, range(16))
    print(f"tokenized {sum(map(len, tokens))} words", flush=True)


if __name__ == "__main__":
    main()
