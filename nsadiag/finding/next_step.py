"""The next step of a stuck run, from the end of its wait chain (nsadiag.verdict.chain),
and of a slow run, from its cause class (nsadiag.verdict.slow_cause): never from the
verdict's name alone.

``chain_next(chain)`` says what to change for each way a chain ends (``ENDS``): a lock
sentence only where a lock is in the chain, end of file for a child reading a pipe this
process holds, a timeout for a polling loop, and so on. None for a chain whose end the
evidence does not name: the caller then says what it knows without a cause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.verdict.chain import WaitChain
from nsadiag.verdictfacts import Load, SlowCause, Worker

JOIN_CALL = re.compile(r"([A-Za-z_][\w.]*)\.join\(")
"""The process a line joins (``worker.join()`` joins ``worker``)."""


def _where(chain: WaitChain, index: int) -> str:
    hops = chain.hops
    if not -len(hops) <= index < len(hops) or not hops[index].where:
        return ""
    return f" at {hops[index].where}"


def _where_queue(chain: WaitChain) -> str:
    """" at file:line" of the chain's wait on a queue (after a join that led to it, the
    joined thread's wait), the first hop's where it has none."""
    index = next((i for i, hop in enumerate(chain.hops) if hop.kind == "queue"), 0)
    return _where(chain, index)


def _where_lock(chain: WaitChain) -> str:
    """" at file:line" of the chain's last wait for a lock ("" when it has none)."""
    index = next((i for i in range(len(chain.hops) - 1, -1, -1)
                  if chain.hops[i].kind == "lock"), len(chain.hops))
    return _where(chain, index)


def _called(chain: WaitChain) -> str:
    where = _where(chain, 0)
    return f" (called{where})" if where else ""


_SOCKET_TIMEOUT = ("give the socket a timeout (`settimeout(...)`, or the client call's "
                   "`timeout=`) so that a peer that never answers fails the read")
"""The half of a socket chain's Next that holds whatever the peer is."""


def chain_next(chain: WaitChain) -> str | None:
    """One sentence: what to change where the chain ends (see the module docstring)."""
    subject = chain.subject or "it"
    end = chain.end
    if end == "lock-cycle":
        return (f"Take the locks `{subject}` in the same order in every thread (or hold one "
                f"at a time): each of the two threads holds one and waits for the other"
                f"{_where(chain, 0)}{_where(chain, -1).replace(' at ', ' and ')}.")
    if end == "lock-self":
        return (f"Do not take the lock `{subject}` again while the same thread holds it"
                f"{_where(chain, -1)}: release it before the call that leads to the wait"
                f"{_where(chain, 0)}, or make it a `threading.RLock`.")
    if end == "queue-full":
        return (f"Do not hold the lock `{subject}` across a blocking `put`"
                f"{_where(chain, -1)}: put the item after releasing it (or "
                f"`put(timeout=...)`), since the thread that empties the queue first waits "
                f"for `{subject}`{_where(chain, 0)}.")
    if end == "lock-held":
        return (f"The lock `{subject}` stays held while its holder does what the chain's last hop "
                f"shows{_where(chain, -1)}: release it before that, or do not wait for it"
                f"{_where(chain, 0)}.")
    if end == "lock-lost":
        return (f"Release the lock `{subject}` on every path (a `with` block, or "
                f"`try`/`finally`): it is locked, and no live thread is inside a `with` "
                f"block for it, so an acquire without its release (or a thread that "
                f"has ended) holds it{_where(chain, 0)}.")
    if end == "lock-lost-fork" and any("DataLoader worker" in h.text for h in chain.hops):
        return (f"Do not fork while a thread holds `{subject}`: start the DataLoader workers "
                f"with `multiprocessing_context=\"spawn\"` (or \"forkserver\"), or create the "
                f"lock in each worker (`worker_init_fn`).")
    if end == "lock-lost-fork":
        # acquiring before the fork and releasing on both sides is how the standard
        # library keeps its own locks (logging's) consistent across os.fork()
        return (f"Do not fork while another thread may hold `{subject}`: start the child "
                f"with the spawn start method (`multiprocessing.get_context(\"spawn\")`), or "
                f"take the lock around every fork (`os.register_at_fork(before={subject}"
                f".acquire, after_in_parent={subject}.release, after_in_child={subject}"
                f".release)`); the child waits for it{_where_lock(chain)}.")
    if end == "producer-died":
        return (f"Fix the exception that ended the thread feeding `{subject}` (the chain names "
                f"it), and have that thread put a sentinel in a `finally` so the wait"
                f"{_where_queue(chain)} ends when it dies (or `get(timeout=...)`).")
    if end == "no-producer":
        return (f"Make sure a thread feeds `{subject}` and puts a sentinel when it ends, or "
                f"wait with a timeout{_where_queue(chain)}: no thread is known to feed it.")
    if end == "pipe-eof":
        return (f"Close the write end before waiting for `{subject}` (`proc.stdin.close()`), "
                f"or use `communicate()` / `subprocess.run(input=...)`, which send end of "
                f"file{_where(chain, 0)}.")
    if end == "pipe-held":
        return (f"`{subject}` holds the write end of the pipe read{_where(chain, 0)} open, so "
                f"the read never reaches end of file: start that process with its output "
                f"elsewhere (`stdout=subprocess.DEVNULL`, or `> /dev/null 2>&1` in a shell "
                f"command), or read with a timeout (`communicate(timeout=...)`).")
    if end == "child-waits":
        return (f"The child `{subject}` never exits: make what it waits for happen, or wait "
                f"for it with a timeout (`wait(timeout=...)`){_where(chain, 0)}.")
    if end == "compile-cxx":
        return (f"torch.compile{_called(chain)} waits for `{subject}`, which its C++ build "
                f"runs as the compiler (or a wrapper around it) and which does not exit: run "
                f"that compiler by hand to see why, or point torch.compile at one that works "
                f"(it runs the `CXX` environment variable when set, else `g++`).")
    if end == "compile-child":
        return (f"torch.compile{_called(chain)} waits for `{subject}`, a program it started "
                f"and which does not exit: run it by hand to see why.")
    if end == "compile-worker":
        return (f"torch.compile{_called(chain)} waits for a job its compile worker runs"
                f"{_where(chain, -1)}, which never finishes: give the wait a timeout "
                f"(`TORCHINDUCTOR_COMPILE_WORKER_WAIT_TIMEOUT`, in seconds) so that it fails "
                f"naming the kernel instead of hanging, and run with "
                f"`TORCHINDUCTOR_COMPILE_THREADS=1` to compile in the main process, where the "
                f"job's own stack shows what it waits for.")
    if end == "sleep":
        return (f"Remove or shorten the sleep{_where(chain, 0)} (`{subject}`): the thread does "
                f"nothing else while it sleeps, and the evidence shows no other work going on.")
    if end == "terminal-input":
        return (f"Answer the prompt at the terminal: the program waits{_where(chain, 0)} for "
                f"a line typed at the terminal ({subject}). For runs with no one there, give the "
                f"script its answer another way (the script's own option for it, or stdin "
                f"from a file: `< answers.txt`).")
    if end == "pool-lost-task":
        return (f"A worker of the pool ended while it ran a task: `multiprocessing.Pool` starts "
                f"a new worker but never returns that task's result, so the wait"
                f"{_where(chain, 0)} never ends. Find why the worker ended (an out-of-memory "
                f"kill shows in `dmesg`), and use `concurrent.futures.ProcessPoolExecutor`, "
                f"which raises `BrokenProcessPool` when a worker dies, or "
                f"`map_async(...).get(timeout=...)`.")
    if end == "pool-worker-ended":
        return _pool_worker_ended_next(chain)
    if end == "pool-worker":
        return (f"The pool's worker stands{_where(chain, -1)} and never returns its task's "
                f"result: make that line return (run the function once in the main process to "
                f"see it alone), or wait with `map_async(...).get(timeout=...)`.")
    if end == "file-lock":
        return (f"The process holding the file lock on {subject} waits while it holds it"
                f"{_where(chain, -1)}: release the lock before that wait, or take it here "
                f"with `LOCK_NB` and a retry deadline{_where(chain, 0)}.")
    if end == "worker":
        return (f"The DataLoader worker stands{_where(chain, -1)} and never returns a batch: "
                f"make that line return (run the dataset with `num_workers=0` to see it "
                f"alone), or set the DataLoader's `timeout`.")
    if end == "socket-peer":
        return (f"Make `{subject}` answer (the chain's last hop shows where it stands "
                f"instead), and {_SOCKET_TIMEOUT}{_where(chain, 0)} rather than holding it.")
    if end == "socket-remote":
        return (f"Find why {subject} sends nothing: it is out of sight from this machine; "
                f"{_SOCKET_TIMEOUT}{_where(chain, 0)} rather than holding it.")
    if end == "uneven-steps":
        return (f"Give every rank the same number of steps: the ranks' steps differ "
                f"({subject}), so a rank waits after its last step{_where(chain, -1)} while "
                f"another waits in the gradient collective of a step it never began. Find "
                f"what ended that rank's loop first: a `return` or `break` taken on that rank "
                f"only (a check of its own batch: make every rank take it together, with "
                f"the flag reduced over the ranks by `all_reduce` before the test), or its "
                f"data running out first (then a `DistributedSampler` with "
                f"`drop_last=True`, or DDP's `join` context).")
    if end == "pipe-unread" and subject == "multiprocessing.Queue":
        joined = JOIN_CALL.search(chain.hops[0].code or "")
        join = f"{joined[1]}.join()" if joined else "p.join()"
        return (f"Read the queue before waiting for the child to exit{_where(chain, 0)}: "
                f"`q.get()` before `{join}`; what the child put on it fills the pipe, and "
                f"the child cannot exit until that is read.")
    if end == "pipe-unread":
        return (f"Read what the child writes into {subject} before waiting for it to exit"
                f"{_where(chain, 0)} (`communicate()` for a subprocess), or wait with a "
                f"timeout and read in between: the child cannot exit until it is read.")
    if end == "loop-self":
        return (f"Do not block the event loop's own thread on a future{_where(chain, 0)}: "
                f"in async code `await` the coroutine (or `await asyncio.wrap_future(fut)`), "
                f"and call `run_coroutine_threadsafe(...).result()` only from another "
                f"thread.")
    if end == "pool-starved":
        return (f"Do not wait inside a task of `{subject}` for another task of the same pool"
                f"{_where(chain, -1)}: every worker is taken by such a wait. Do the inner "
                f"work directly in the task (no `submit`), give it a pool of its own, or make "
                f"`max_workers` larger than the tasks that can wait at once.")
    if end == "stopped":
        if subject.startswith("tracer"):
            return (f"Continue or detach the {subject} (`c` or `detach` in gdb, or end the "
                    f"strace): it holds the process stopped, so the run cannot progress.")
        stands = f" (its main thread stands{_where(chain, -1)})" if len(chain.hops) > 1 \
            else ""
        return (f"Find what stops {subject}{stands}: an `os.kill(..., signal.SIGSTOP)` or "
                f"`kill -STOP` in the program or its launcher, Ctrl-Z at its terminal "
                f"(SIGTSTP), or a background job reading or writing the terminal "
                f"(SIGTTIN/SIGTTOU: give it `< /dev/null`, or run it in the foreground); "
                f"`kill -CONT` resumes a stopped process.")
    if end == "poll":
        return (f"Add a timeout to the polling loop{_where(chain, 0)} (raise once "
                f"`{subject}` has held past a deadline), and make sure what should end it "
                f"runs.")
    return None


def _pool_worker_ended_next(chain: WaitChain) -> str:
    """The Next of a pool whose worker ended while it ran the awaited task: why it ended
    is looked for where its exit status points (a SIGKILL nsadiag did not send is most
    often the kernel's out-of-memory killer)."""
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
            f"result, so the wait{_where(chain, 0)} never ends: use "
            f"`concurrent.futures.ProcessPoolExecutor`, which raises `BrokenProcessPool` "
            f"when a worker dies, or `map_async(...).get(timeout=...)`.")


def _workers_said(workers: Sequence[Worker]) -> tuple[str, str]:
    """("2 DataLoader workers", "read_record (data.py:26) `time.sleep(...)`") of the workers
    sampled at the kill, their line said once when they share it."""
    places = sorted({str(worker.where) for worker in workers if worker.where})
    code = next((f" `{w.code}`" for w in workers if w.code), "") \
        if len(places) == 1 else ""
    noun = "DataLoader worker" + ("s" if len(workers) > 1 else "")
    return f"{len(workers)} {noun}", " and ".join(places) + code


def _data_next(cause: SlowCause, load: Load | None) -> str:
    share = f"{cause.share:.0%}"
    workers = cause.workers or ()
    if not workers and cause.loaded_at:
        # workers overlap the loading with training, but divide its cost by at most the
        # CPUs there are: work the dataset repeats for every item is fixed only where it is
        return (f"Make the dataset's own code cheaper, then load the batches in worker "
                f"processes: the main process was in the DataLoader's `__next__` in {share} "
                f"of its samples, running the dataset's code itself, most at "
                f"{cause.loaded_at}. Look there first for work done again for every item "
                f"that is the same for all of them (a statistic of the whole dataset, a "
                f"vocabulary, a file or a model loaded again): do it once, in `__init__`. "
                f"Then set `num_workers` above 0 (and `prefetch_factor`) so loading "
                f"overlaps training. A faster model will not help.")
    if not workers:
        return (f"Make the input pipeline faster: the main process waited for batches in "
                f"{share} of its samples, and no DataLoader worker was sampled to say "
                f"which part is slow; time the dataset alone (its `__getitem__` and the "
                f"storage it reads), then add workers, faster storage or prefetch as that "
                f"shows. A faster model will not help.")
    many, where = _workers_said(workers)
    idle = sum(w.samples - w.active for w in workers)
    total = sum(w.samples for w in workers)
    inside = sum(w.in_own for w in workers)
    if 2 * inside < total:
        return (f"Find what delays the batches between the workers and the main process: "
                f"the main process waited for batches in {share} of its samples while its "
                f"{many} {'were' if len(workers) > 1 else 'was'} outside the dataset's code "
                f"(waiting for work) in {total - inside} of {total} samples; look at the "
                f"collate function, `pin_memory` and the batch's size. A faster model will "
                f"not help.")
    if 2 * idle >= total:
        return (f"Make the batches arrive faster: the main process waited for them in "
                f"{share} of its samples while its {many} sat at {where}, off the CPU in "
                f"{idle} of {total} samples (a wait such as a read, not computation): read "
                f"from faster or local storage (or cache what is read), and raise "
                f"`num_workers` above {len(workers)} and `prefetch_factor` so more reads "
                f"overlap. A faster model will not help.")
    busy = load.load_per_cpu if load is not None else None
    more = (f"the machine's CPUs were already busy (load {busy:.1f} per CPU), so more "
            f"workers will not help" if busy is not None and busy >= 1 else
            f"raise `num_workers` above {len(workers)} while CPUs are free")
    return (f"Make each batch cheaper to build: the main process waited for batches in "
            f"{share} of its samples while its {many} computed at {where} (on the CPU in "
            f"{total - idle} of {total} samples); precompute that work once, or {more}. A "
            f"faster model will not help.")


def _recompile_next(cause: SlowCause) -> str:
    guard, function = cause.guard, cause.function
    counted = (f"the guard `{guard}` failed, and Dynamo compiled `{function}` again "
               f"{cause.recompiles} times in {cause.steps} steps")
    if cause.size_dim is not None:
        dim = cause.size_dim
        return (f"Stop the recompiles: {counted}, once for each new size of dimension {dim}; "
                f"compile with `dynamic=True` (or mark dimension {dim} dynamic with "
                f"`torch._dynamo.mark_dynamic`), or pad the inputs to a few fixed sizes.")
    return (f"Stop the recompiles: {counted}; keep what that guard checks the same from "
            f"step to step, or make it an input Dynamo treats as dynamic.")


def _recompute_next(cause: SlowCause) -> str:
    called = f" (checkpointed at {cause.called_at})" if cause.called_at else ""
    hottest = (f"; or, if the recomputed line's result needs no gradient, compute it "
               f"outside the checkpointed function (its hottest line: {cause.inner})"
               if cause.inner else "")
    return (f"Checkpoint less: the backward spent {cause.backward_share:.0%} of its "
            f"samples rerunning checkpointed forwards{called}; checkpoint fewer blocks, or "
            f"save the costly results with a selective checkpoint policy "
            f"(`torch.utils.checkpoint.create_selective_checkpoint_contexts`){hottest}.")


def slow_next(cause: SlowCause, load: Load | None = None) -> str:
    """One sentence: what to change for a SLOW run's cause class (nsadiag.verdict
    .slow_cause), from the figures that classified it; ``load`` the machine's load facts
    (whether more worker processes could run)."""
    if cause.kind == "data-bound":
        return _data_next(cause, load)
    if cause.kind == "recompiles":
        return _recompile_next(cause)
    if cause.kind == "outside-model":
        return (f"Make {cause.loaded_at} cheaper: it does tensor work of its own outside the "
                f"model ({cause.share or 0:.0%} of the training samples); print the shapes "
                f"of the tensors it takes and makes (`t.shape`): an unintended broadcast "
                f"(`[B, 1] - [B]` is `[B, B]`) or work redone every step shows there.")
    if cause.kind == "model-compute":
        busy = _busy(load)
        return (f"Nothing to fix: no defect was found, the time goes into the model's own "
                f"work. To finish sooner give the run more time, make the model or the batch "
                f"smaller, or run it on a faster device (a GPU){busy}.")
    return _recompute_next(cause)


def _busy(load: Load | None) -> str:
    """", and on a machine less busy: ..." when the load figures say contention slowed it."""
    if load is None or not load.contended:
        return ""
    got = f"; the main thread got {load.got:.0%} of the CPU it asked for" \
        if load.got is not None else ""
    return (f"; the machine was busy (load {load.load_per_cpu:.1f} per CPU{got}), so a "
            f"quieter one runs it faster too")
