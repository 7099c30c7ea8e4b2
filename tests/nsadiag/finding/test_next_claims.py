"""Every claim of a stuck run's Next line against the chain it was built from
(nsadiag.finding.next_step, nsadiag.finding.trial.next_action): a lock sentence only where
a lock is in the chain, end of file only for a pipe, a timeout for a polling loop, never
per-token advice, and every name it quotes is one the chain printed; and of a slow run's
Next against the cause class it was built from (nsadiag.verdict.slow_cause): storage only
for workers idle in their reads, `dynamic=True` only for a size guard, every share and
line it quotes one the cause line printed."""

from __future__ import annotations

import re

import pytest

from nsadiag.evidence import Evidence, ProcessOutcome, StackFrame, StackSample, ThreadStack
from nsadiag.finding.next_step import chain_next, slow_next
from nsadiag.finding.trial import next_action
from nsadiag.probes.profile import summarize
from nsadiag.probes.sampler import READABLE_VERSIONS
from nsadiag.verdict.slow_cause import slow_cause
from nsadiag.verdict.waits import ENDS
from nsadiag.verdict.waits.model import Hop, WaitChain
from nsadiag.verdictfacts import VerdictFacts

LOCK_WORDS = re.compile(r"\blocks?\b|RLock|`with`", re.IGNORECASE)
FIX_CODE = {"proc.stdin.close()", "communicate()", "subprocess.run(input=...)",
            "put(timeout=...)", "get(timeout=...)", "wait(timeout=...)", "finally", "with",
            "try", "threading.RLock", "return", "break", "multiprocessing_context=\"spawn\"",
            "worker_init_fn",
            "LOCK_NB", "timeout", "num_workers=0", "put", "DistributedSampler",
            "drop_last=True", "join", "settimeout(...)", "timeout=", "CXX", "g++",
            "multiprocessing.Pool", "concurrent.futures.ProcessPoolExecutor",
            "BrokenProcessPool", "map_async(...).get(timeout=...)", "dmesg", "< answers.txt",
            "TORCHINDUCTOR_COMPILE_WORKER_WAIT_TIMEOUT", "TORCHINDUCTOR_COMPILE_THREADS=1",
            "stdout=subprocess.DEVNULL", "> /dev/null 2>&1", "communicate(timeout=...)",
            "os.kill(..., signal.SIGSTOP)", "kill -STOP", "< /dev/null", "kill -CONT", "c",
            "detach", "await", "await asyncio.wrap_future(fut)",
            "run_coroutine_threadsafe(...).result()", "submit", "max_workers", "q.get()",
            "p.join()", 'multiprocessing.get_context("spawn")', "all_reduce", "wait()",
            "BrokenBarrierError", "torch.set_num_threads(1)", "q.get(timeout=...)",
            "p.exitcode", "exit", "torchrun --nproc_per_node N train.py", "RANK",
            "WORLD_SIZE", "world_size", "timeout=datetime.timedelta(seconds=60)",
            "init_process_group", "future.result(timeout=...)"}
FIX_TEMPLATES = ("os.register_at_fork(before={0}.acquire, after_in_parent={0}.release, "
                 "after_in_child={0}.release)", "{0}.abort()")
"""Fixes quoted with the chain's subject in them (the lock a fork copied locked, the
barrier a party leaves)."""

CHAINS = [
    WaitChain((Hop("lock", "the main thread waits for `a` at t.py:5", "t.py:5"),
               Hop("holder", "`a` is held by thread w (inside `with a:` at t.py:9)", "t.py:9"),
               Hop("lock", "thread w waits for `b` at t.py:10, which the main thread holds "
                           "(inside `with b:` at t.py:4): each waits for the other",
                   "t.py:10")), "lock-cycle", "a` and `b"),
    WaitChain((Hop("lock", "the main thread waits for `a` at t.py:5", "t.py:5"),
               Hop("holder", "`a` is held by the same thread, in run (inside `with a:` at "
                             "t.py:2): a lock that is not reentrant, taken twice", "t.py:2")),
              "lock-self", "a"),
    WaitChain((Hop("lock", "the main thread waits for `a` at t.py:5", "t.py:5"),
               Hop("holder", "`a` is held by thread w (inside `with a:` at t.py:9)", "t.py:9"),
               Hop("frame", "thread w runs t.py:12 `crunch()`", "t.py:12")), "lock-held", "a"),
    WaitChain((Hop("lock", "the main thread waits for `a` at t.py:5", "t.py:5"),
               Hop("holder", "no live thread is inside a `with a:` block")), "lock-lost", "a"),
    WaitChain((Hop("worker", "the main thread waits for a batch from the DataLoader at "
                             "t.py:3", "t.py:3"),
               Hop("lock", "DataLoader worker 0 (pid 9) waits for `self.lock` at t.py:40",
                   "t.py:40"),
               Hop("holder", "`self.lock` is held by no thread of DataLoader worker 0: it was "
                             "locked when the process was forked")), "lock-lost-fork",
              "self.lock"),
    WaitChain((Hop("child", "the main thread waits for child pid 9 (`python t.py`) to exit at "
                            "t.py:62", "t.py:62", "proc.join()"),
               Hop("lock", "in pid 9 (forked from this process, no exec), the main thread "
                           "waits for `METRICS_LOCK` at t.py:42", "t.py:42"),
               Hop("holder", "`METRICS_LOCK` is held by no thread of pid 9, a forked copy of "
                             "this process: it was locked when the process was forked, by a "
                             "thread that does not exist in the copy")), "lock-lost-fork",
              "METRICS_LOCK"),
    WaitChain((Hop("lock", "the main thread waits for `s` at t.py:43", "t.py:43"),
               Hop("holder", "`s` is held by thread loader (inside `with s:` at t.py:30)",
                   "t.py:30"),
               Hop("queue", "thread loader waits in `q.put` at t.py:31 (the queue is full)",
                   "t.py:31")), "queue-full", "s"),
    WaitChain((Hop("queue", "the main thread waits for an item from `batches` at t.py:47",
                   "t.py:47"),
               Hop("producer", "thread producer died of ValueError: x at parse (t.py:30)")),
              "producer-died", "batches"),
    WaitChain((Hop("queue", "the main thread waits for an item from `batches` at t.py:47",
                   "t.py:47"),
               Hop("producer", "no other thread of the process is alive to feed it")),
              "no-producer", "batches"),
    WaitChain((Hop("child", "the main thread waits for child pid 3 (`sort -u`) to exit at "
                            "t.py:27", "t.py:27"),
               Hop("pipe", "pid 3 is blocked reading fd 0 (its stdin), pipe:[7], a pipe whose "
                           "write end this process holds (fd 10)")), "pipe-eof", "sort -u"),
    WaitChain((Hop("child", "the main thread waits to read the output of child pid 3 (`sh`) "
                            "at t.py:12", "t.py:12"),
               Hop("ended", "pid 3 ended (exited with code 0)"),
               Hop("pipe", "but the write end of its output (pipe:[7]) is still open in pid "
                           "4 (`python serve.py`, fd 1): the read never reaches end of file "
                           "while it is")), "pipe-held", "python serve.py"),
    WaitChain((Hop("child", "the main thread waits for child pid 3 (`tool`) to exit at "
                            "t.py:27", "t.py:27"),
               Hop("process", "pid 3 waits in the kernel at hrtimer_nanosleep")),
              "child-waits", "tool"),
    WaitChain((Hop("child", "the main thread waits to read the output of child pid 3 (`sleep "
                            "9`) inside torch.compile (cpp_compiler_search at "
                            "cpp_builder.py:104) at t.py:5", "t.py:5"),
               Hop("process", "pid 3 waits in the kernel at hrtimer_nanosleep")),
              "compile-cxx", "sleep 9"),
    WaitChain((Hop("child", "the main thread waits for child pid 3 (`ptxas -v`) to exit "
                            "inside torch.compile (compile at triton_compat.py:9) at t.py:5",
                   "t.py:5"),
               Hop("process", "pid 3 is blocked reading fd 0 (its stdin) (/dev/tty)")),
              "compile-child", "ptxas -v"),
    WaitChain((Hop("compile-pool", "the main thread waits for a job of torch.compile's "
                                   "compile workers (inductor's compile-worker process, pid "
                                   "5) at t.py:5", "t.py:5"),
               Hop("frame", "compile worker pid 6 is inside its job at subproc_pool.py:475 "
                            "`result = job()`, in the kernel at hrtimer_nanosleep",
                   "subproc_pool.py:475")), "compile-worker"),
    WaitChain((Hop("compile-pool", "the main thread waits for a job of torch.compile's "
                                   "compile workers at t.py:5", "t.py:5"),
               Hop("child", "thread ThreadPoolExecutor-0_0 waits to read the output of child "
                            "pid 3 (`cxx.sh k.cpp`) in torch.compile's C++ build "
                            "(_run_compile_cmd at cpp_builder.py:696)"),
               Hop("process", "pid 3 waits in the kernel at do_wait")),
              "compile-cxx", "cxx.sh k.cpp"),
    WaitChain((Hop("pool", "the main thread waits for the results of a multiprocessing pool "
                           "at t.py:12", "t.py:12"),
               Hop("pool", "both its workers (pids 4, 5) wait idle for a task: none runs the "
                           "task whose result this waits for")), "pool-lost-task"),
    WaitChain((Hop("pool", "the main thread waits for the results of a multiprocessing pool "
                           "at t.py:12", "t.py:12"),
               Hop("ended", "pool worker pid 6 ended (killed by SIGKILL) while it ran the "
                            "task; the pool replaced it with pid 7, which never gets that "
                            "task (the workers it has now wait idle)")),
              "pool-worker-ended", "pool worker pid 6"),
    WaitChain((Hop("pool", "the main thread waits for the results of a multiprocessing pool "
                           "at t.py:12", "t.py:12"),
               Hop("ended", "pool worker pid 6 ended (its exit status is not known: no "
                            "watched process reaped it) while it ran the task; its worker "
                            "now waits idle, and none gets that task")),
              "pool-worker-ended", "pool worker pid 6"),
    WaitChain((Hop("pool", "the main thread waits for the results of a multiprocessing pool "
                           "at t.py:12", "t.py:12"),
               Hop("frame", "pool worker pid 4 runs t.py:30 `parse(doc)`", "t.py:30")),
              "pool-worker"),
    WaitChain((Hop("future", "the main thread waits for a future's result at t.py:12",
                   "t.py:12", "rows = job.result()"),
               Hop("pool", "thread io_0 runs t.py:30 `parse(doc)` (a worker of io): the task, "
                           "still running", "t.py:30", "parse(doc)")),
              "executor-task", "io"),
    WaitChain((Hop("sleep", "the main thread sleeps at t.py:8 `time.sleep(3600)  # debug` "
                            "(3600 s, as written)", "t.py:8"),), "sleep", "time.sleep(3600)"),
    WaitChain((Hop("terminal", "the main thread waits for a line typed at the terminal "
                               "(/dev/pts/3, fd 0, its stdin) at t.py:5", "t.py:5"),),
              "terminal-input", "/dev/pts/3"),
    WaitChain((Hop("file-lock", "the main thread waits for the flock lock on /tmp/c at t.py:40",
                   "t.py:40"),
               Hop("holder", "it is held (write) by pid 8, by /proc/locks"),
               Hop("frame", "pid 8: the main thread waits at w.py:28 `ev.wait()`", "w.py:28")),
              "file-lock", "/tmp/c"),
    WaitChain((Hop("worker", "the main thread waits for a batch from the DataLoader at t.py:3",
                   "t.py:3"),
               Hop("worker", "DataLoader worker 0 (pid 9) runs t.py:50 `read()`", "t.py:50")),
              "worker"),
    WaitChain((Hop("poll", "the main thread polls `not os.path.exists(m)` in a sleep loop at "
                           "t.py:23, still looping at the stall", "t.py:23"),),
              "poll", "not os.path.exists(m)"),
    WaitChain((Hop("socket", "the main thread waits to read fd 5, a TCP connection from "
                             "127.0.0.1:40100 to 127.0.0.1:8123 at t.py:14", "t.py:14"),
               Hop("peer", "the other end (127.0.0.1:8123) is held by pid 7 (`python "
                           "server.py`)"),
               Hop("frame", "pid 7: the main thread waits at server.py:30 `done.wait()`",
                   "server.py:30")), "socket-peer", "python server.py"),
    WaitChain((Hop("socket", "the main thread waits to read fd 5, a TCP connection from "
                             "10.0.0.2:40100 to 10.0.0.9:6379 at t.py:14", "t.py:14"),
               Hop("peer", "the other end, 10.0.0.9:6379, is on another machine: what it "
                           "does is not visible from here")), "socket-remote",
              "10.0.0.9:6379"),
    WaitChain((Hop("collective", "rank 0 waits in all_reduce #5 (DDP bucket 0, 4 tensors), the "
                                 "gradients of step 4 at t.py:44 (rank 0: 4 steps done)",
                   "t.py:44"),
               Hop("collective", "rank 1 never began step 4: it ran 4 steps and waits in "
                                 "barrier #5 at t.py:49")),
              "uneven-steps", "rank 0 began 5, rank 1 ran 4"),
    WaitChain((Hop("collective", "rank 1 waits in all_reduce #3 (4 bytes) at t.py:20"),
               Hop("collective", "rank 0 waits in all_reduce #3 (DDP bucket 0) at t.py:30")),
              "collective-differs", "all_reduce #3 (4 bytes)"),
    WaitChain((Hop("frame", "the main thread waits at t.py:12 `f.result()`", "t.py:12"),
               Hop("unknown", "what would release it is not named by the evidence")),
              "unknown"),
    WaitChain((Hop("process", "pid 41 is stopped (state T): nothing in it runs or waits; a "
                              "SIGSTOP, SIGTSTP (Ctrl-Z), SIGTTIN or SIGTTOU stopped it, and "
                              "only SIGCONT resumes it"),
               Hop("frame", "the main thread runs t.py:5 `os.kill(os.getpid(), "
                            "signal.SIGSTOP)`", "t.py:5")), "stopped", "pid 41"),
    WaitChain((Hop("child", "the main thread waits for child pid 9 (`python t.py`) to exit at "
                            "t.py:9", "t.py:9"),
               Hop("process", "thread 10 of pid 9 is blocked writing into pipe:[5], a pipe whose "
                           "read end this process holds and does not read while it waits: "
                           "the child cannot exit before its data is read")),
              "pipe-unread", "pipe:[5]"),
    WaitChain((Hop("future", "the main thread waits for a future's result at t.py:7",
                   "t.py:7"),
               Hop("holder", "the main thread is the thread that runs the asyncio event loop "
                             "(its stack holds the loop's own frames below this wait): the "
                             "coroutine behind the future needs that loop, which is blocked in "
                             "this wait")), "loop-self", "t.py:7"),
    WaitChain((Hop("future", "the main thread waits for a future's result at t.py:10",
                   "t.py:10"),
               Hop("pool", "every worker of ThreadPoolExecutor-0 (1: ThreadPoolExecutor-0_0) "
                           "runs a task that itself waits for a future at t.py:8: the tasks "
                           "they wait for are queued behind them in the same pool, and no "
                           "worker is left to run them", "t.py:8")), "pool-starved",
              "ThreadPoolExecutor-0"),
]
QUEUE_UNREAD = WaitChain((
    Hop("child", "the main thread waits for child pid 9 (`python t.py`) to exit at t.py:9",
        "t.py:9"),
    Hop("process", "thread QueueFeederThread of pid 9 is blocked writing into pipe:[5], a pipe "
                "whose read end this process holds and does not read while it waits: the "
                "child cannot exit before its data is read (a multiprocessing.Queue's feeder "
                "thread flushes what was put on the queue before its process exits)")),
    "pipe-unread", "multiprocessing.Queue")
BARRIER_WAIT = Hop("barrier", "the main thread waits at the barrier `epoch_start` at t.py:27",
                   "t.py:27", "epoch_start.wait()")
CHAINS += [
    WaitChain((BARRIER_WAIT, Hop("barrier", "3 threads wait at `epoch_start` (main thread at "
                                            "t.py:27; thread loader-a at t.py:16; thread "
                                            "loader-b at t.py:16) and no other live thread "
                                            "of the process is left to arrive: the barrier "
                                            "was built for more parties than call `wait()`")),
              "barrier-short", "epoch_start"),
    WaitChain((BARRIER_WAIT, Hop("barrier", "2 threads wait at `epoch_start` (main thread at "
                                            "t.py:27; thread loader-a at t.py:16) and no "
                                            "other live thread of the process is left to "
                                            "arrive"),
               Hop("producer", "thread loader-c died of FileNotFoundError: c.bin at load "
                               "(t.py:13), a party that never arrives", "t.py:13")),
              "barrier-party-died", "epoch_start"),
    WaitChain((BARRIER_WAIT, Hop("barrier", "2 threads wait at `epoch_start` (main thread at "
                                            "t.py:27; thread loader-a at t.py:16); the other "
                                            "live threads, one of which must arrive: thread "
                                            "checksum runs t.py:15 `total = (total + 1) % 7`",
                                 "t.py:15", "total = (total + 1) % 7")),
              "barrier-missing", "epoch_start"),
]
MP_GET = Hop("queue", "the main thread waits for an item from the multiprocessing queue `q` "
                     "at t.py:26", "t.py:26", "result = q.get()")
CHAINS += [
    WaitChain((MP_GET,
               Hop("frame", "in pid 200 (forked from this process, no exec), the main thread "
                            "waits inside torch's Linear.forward (linear.py:134), called at "
                            "t.py:11 `out = model(x)`", "t.py:11", "out = model(x)"),
               Hop("pool", "pid 200 was forked without an exec: torch's intra-op thread pool "
                           "is not copied by a fork, and the op waits for pool threads the "
                           "copy does not have")), "fork-thread-pool", "t.py:11"),
    WaitChain((MP_GET, Hop("ended", "no child of this process is alive to put on it: pid 250 "
                                    "(`Process-1`) ended (exited with code 1)")),
              "queue-producer-ended", "pid 250"),
    WaitChain((MP_GET, Hop("process", "the children that could put on it: pid 200 (`python "
                                      "t.py`) waits in the kernel at futex_do_wait; pid 201 "
                                      "(`python t.py`) waits in the kernel at pipe_read (none "
                                      "was sampled at a line of its own)")),
              "process-queue", "q"),
]
JOINING = Hop("rendezvous", "the main thread waits in torch.distributed's `init_process_group` "
                          "at t.py:12 for every rank of the group to join", "t.py:12",
              "dist.init_process_group(\"gloo\")")
CHAINS += [
    WaitChain((JOINING, Hop("rendezvous", "no other process of the job was seen: the ranks it "
                                          "waits for never started under this command")),
              "rendezvous-missing", "init_process_group"),
    WaitChain((JOINING, Hop("frame", "rank 1 (pid 9) has not joined it: runs t.py:30 "
                                     "`build_vocab(corpus)`", "t.py:30", "build_vocab(corpus)")),
              "rendezvous-late", "init_process_group"),
]
STOPPED_BY_TRACER = WaitChain((Hop("process", "pid 41 is held stopped by its tracer, pid 77 "
                                              "(`gdb -p 41`): it runs again only when the "
                                              "tracer continues it or detaches"),),
                              "stopped", "tracer pid 77")


def test_the_table_covers_every_way_a_chain_ends():
    assert {chain.end for chain in CHAINS} == set(ENDS)


@pytest.mark.parametrize("chain", [*CHAINS, STOPPED_BY_TRACER, QUEUE_UNREAD],
                         ids=lambda chain: chain.end)
def test_each_next_claim_follows_from_its_chain(chain):
    said = chain_next(chain)
    if chain.end == "unknown":
        assert said is None  # no cause is named where the chain names none
        said = next_action("DEADLOCK", VerdictFacts.of({"wait_chain": chain.to_dict()}), None)
    if chain.end == "collective-differs":
        assert said is None  # the collective verdict's own sentence: an extra collective
        said = next_action("STALL-COLLECTIVE", VerdictFacts.of({"wait_chain": chain.to_dict()}),
                           None)
    if chain.end == "uneven-steps":
        assert "same number of steps" in said and chain.subject in said
        assert "some ranks only" not in said
    assert bool(LOCK_WORDS.search(said)) == (chain.has("lock") or chain.has("file-lock")), said
    assert ("end of file" in said) == chain.has("pipe"), said
    assert "timeout" in said or "deadline" in said or chain.end.startswith("lock") or \
        chain.end in ("pipe-eof", "uneven-steps", "collective-differs", "compile-cxx",
                      "compile-child", "terminal-input", "sleep", "stopped", "loop-self",
                      "pool-starved", "pipe-unread", "fork-thread-pool"), said
    # advice about a sleep only where the chain's end is one (a command quoted may hold the
    # word)
    assert "the sleep" not in said or chain.has("sleep"), said
    if chain.end == "poll":
        assert "timeout" in said and chain.subject in said
    # torch.compile is named only where its frames or its compile workers are in the chain,
    # its C++ compiler only where its C++ build is
    assert ("torch.compile" in said) == ("torch.compile" in chain.printed()), said
    assert ("C++" in said) == ("cpp_builder.py" in chain.printed()), said
    # (a terminal also sends the stop signals a stopped chain names)
    assert ("terminal" in said) == (chain.has("terminal") or (
        chain.end == "stopped" and "SIGTTIN" in chain.printed())), said
    # a pool's worker is named only where the chain went through a pool (a file:line quoted
    # from the chain may hold the word)
    words = re.sub(r"\b[\w.]+\.py:\d+", "", said)
    assert ("pool" in words.lower()) == chain.has("pool"), said
    # a signal is named only where the chain says a process was killed by it, and the
    # out-of-memory killer blamed only for a SIGKILL
    ended = " ".join(hop.text for hop in chain.hops if hop.kind == "ended")
    printed = chain.printed()
    for name in re.findall(r"\bSIG[A-Z]+", said):  # or the signals that stop a process
        assert f"killed by {name}" in ended or (chain.end == "stopped" and name in printed), \
            said
    assert "most often the kernel's out-of-memory killer" not in said or \
        "killed by SIGKILL" in ended, said
    if chain.end == "lock-lost-fork":
        assert "fork" in said
        # DataLoader advice only where the chain went through a DataLoader worker
        assert ("DataLoader" in said) == ("DataLoader worker" in chain.printed()), said
    assert "per-token" not in said and "tensor ops" not in said
    printed = chain.printed()
    lines = [hop.code for hop in chain.hops if hop.code]
    for quoted in re.findall(r"`([^`]+)`", said):
        assert quoted in printed or quoted in FIX_CODE or any(quoted in c for c in lines) or \
            quoted in [t.format(chain.subject) for t in FIX_TEMPLATES], (quoted, said)
    for where in re.findall(r"\b[\w.]+\.py:\d+", said):
        assert where in printed, (where, said)


def test_a_queue_joined_before_it_is_read_names_the_process_joined():
    joined = WaitChain((Hop(QUEUE_UNREAD.hops[0].kind, QUEUE_UNREAD.hops[0].text, "t.py:9",
                            "worker.join()"), *QUEUE_UNREAD.hops[1:]),
                       QUEUE_UNREAD.end, QUEUE_UNREAD.subject)
    said = chain_next(joined)
    assert "`q.get()` before `worker.join()`" in said and "p.join()" not in said, said
    assert "`q.get()` before `p.join()`" in chain_next(QUEUE_UNREAD)  # no line: the form


def test_a_deadlock_without_a_chain_names_no_lock_and_no_cause():
    said = next_action("DEADLOCK", VerdictFacts(), None)
    assert not LOCK_WORDS.search(said) and "never released" not in said


# ---- a SLOW run's Next, from its cause class (nsadiag.verdict.slow_cause) -------------------

DATA = "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py"
CKPT = "/usr/lib/python3/site-packages/torch/utils/checkpoint.py"
FX = "/usr/lib/python3/site-packages/torch/_dynamo/convert_frame.py"
MAIN = ["<module>", "/home/u/train.py", 70]
LOOP = ["main", "/home/u/train.py", 57]


def _stack(frames, count, phase, on_cpu):
    return {"frames": [list(f) for f in frames], "count": count, "phase": phase,
            "on_cpu": on_cpu}


def _worker(index, where, active):
    """A DataLoader worker sampled twice at the kill, at ``where`` in its dataset code (or
    waiting for its next index when None)."""
    loop = StackFrame("_worker_loop", "/usr/lib/python3/site-packages/torch/utils/data/"
                                      "_utils/worker.py", 349)
    inner = [StackFrame("read_record", "/home/u/train.py", 26,
                        code="time.sleep(READ_LATENCY_S)"),
             StackFrame("__getitem__", "/home/u/train.py", 39)] if where else \
        [StackFrame("get", "/usr/lib/python3.11/multiprocessing/queues.py", 113)]
    thread = ThreadStack(1, "MainThread", [*inner, loop], active=active)
    samples = [StackSample(float(t), 100 + index, [thread]).to_dict() for t in (0, 1)]
    return {"pid": 100 + index, "role": f"DataLoader worker {index} of the main process",
            "stall": {"samples": samples}}


MODULE = ["_call_impl", "/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1784]
"""The frame under which a module's forward runs (the model's own work)."""


def _evidence(stacks, events=(), others=()):
    summary = summarize({"version": READABLE_VERSIONS[-1], "samples":
                         sum(s["count"] for s in stacks), "stacks": stacks})
    return Evidence(spec={}, events=list(events), event_counts={}, result=None,
                    outcome=ProcessOutcome(exit_code=None), stall=None,
                    expected_events_per_step=None, total_steps=0, profile=summary,
                    others=list(others))


def _data_bound(workers, loads=False):
    inner = [["__getitem__", "/home/u/data.py", 40]] if loads else []
    return _evidence([_stack([MAIN, LOOP, ["__next__", DATA, 733], ["get", DATA, 1200],
                              *inner], 90, "forward", 3),
                      _stack([MAIN, ["main", "/home/u/train.py", 60]], 10, "backward", 10)],
                     others=workers)


def _recompiling(guard):
    events = [{"kind": "compile", "step": step, "function": "forward", "file": "/home/u/m.py",
               "line": 20, "recompile_reason": f"0/{step - 1}: {guard}" if step else None}
              for step in range(5)]
    return _evidence([_stack([MAIN, ["main", "/home/u/train.py", 52], ["__call__", FX, 1432]],
                             60, "forward", 55),
                      _stack([MAIN, ["main", "/home/u/train.py", 54]], 40, "backward", 40)],
                     events=[*events, {"kind": "step", "step": 5}])


def _recomputing():
    block = ["forward", "/home/u/model.py", 30]
    return _evidence([_stack([MAIN, ["main", "/home/u/train.py", 58], ["unpack_hook", CKPT, 1100],
                              block], 70, "backward", 70),
                      _stack([MAIN, ["main", "/home/u/train.py", 58]], 20, "backward", 20),
                      _stack([MAIN, ["forward", "/home/u/model.py", 44],
                              ["checkpoint", CKPT, 480], block], 30, "forward", 30)])


SLOW_CASES = {
    "data, idle workers": lambda: _data_bound([_worker(0, True, False),
                                               _worker(1, True, False)]),
    "data, busy workers": lambda: _data_bound([_worker(0, True, True),
                                               _worker(1, True, True)]),
    "data, idle outside the dataset": lambda: _data_bound([_worker(0, False, False)]),
    "data, no workers sampled": lambda: _data_bound([]),
    "data, loaded in the main process": lambda: _data_bound([], loads=True),
    "recompiles, size guard": lambda: _recompiling(
        "tensor 'ids' size mismatch at index 1. expected 97, actual 113"),
    "recompiles, value guard": lambda: _recompiling("L['scale'] == 0.5"),
    "checkpoint recompute": _recomputing,
}


@pytest.mark.parametrize("case", SLOW_CASES, ids=str)
def test_each_slow_next_claim_follows_from_the_evidence_it_was_built_from(case):
    evidence = SLOW_CASES[case]()
    cause = slow_cause(evidence)
    assert cause is not None, case
    facts = VerdictFacts.of({"slow_cause": cause})
    idle = VerdictFacts.of({"load": {"load_per_cpu": 0.5, "contended": False}}).position.load
    said = slow_next(facts.slow.slow_cause, idle)
    assert said == next_action("SLOW", facts, None)  # the one next step
    # never per-token advice, never a lock, and a data-bound run is not the model's fault
    assert "per-token" not in said and "tensor ops" not in said and not LOCK_WORDS.search(said)
    for number in re.findall(r"\b\d+%", said):
        assert number in cause["sentence"], (number, said)
    for where in re.findall(r"\b[\w.]+\.py:\d+", said):
        assert where in cause["sentence"], (where, said)
    if cause["kind"] == "data-bound":
        workers = cause["workers"]
        assert "A faster model will not help" in said
        idle_reads = workers and all(w["in_own"] == w["samples"] and w["active"] == 0
                                     for w in workers)
        # the storage is blamed only for workers that sat off the CPU in their reads
        assert ("read from faster or local storage" in said) == bool(idle_reads), said
        assert ("precompute" in said) == bool(workers and all(w["active"] for w in workers))
        if workers:
            assert f"above {len(workers)}" in said or "outside the dataset" in said
        elif cause["loaded_at"]:
            assert "`num_workers` above 0" in said and "__getitem__ (data.py:40)" in said
            # the dataset's own line first: workers divide its cost by the CPUs at most
            assert said.index("__getitem__ (data.py:40)") < said.index("num_workers"), said
        else:  # nothing says which part is slow: no part is named
            assert "num_workers" not in said and "no DataLoader worker was sampled" in said
    if cause["kind"] == "recompiles":
        assert cause["recompiles"] == 4 and f"`{cause['guard']}`" in said
        assert cause["guard"] in cause["sentence"] and not cause["guard"].startswith("0/")
        assert ("dynamic=True" in said) == ("size mismatch" in cause["guard"]), said
        assert ("pad" in said) == ("size mismatch" in cause["guard"]), said
    if cause["kind"] == "checkpoint-recompute":
        assert cause["backward_share"] == pytest.approx(70 / 90)
        assert "Checkpoint less" in said and "forward (model.py:30)" in said
        assert cause["called_at"] == "forward (model.py:44)"


def test_no_cause_is_named_below_the_thresholds():
    # the main thread in `__next__` in a fifth of its samples, a checkpoint in a tenth of
    # the backward, two recompiles: no class, and no class's advice
    evidence = _evidence(
        [_stack([MAIN, LOOP, ["__next__", DATA, 733]], 20, "forward", 1),
         _stack([MAIN, ["main", "/home/u/t.py", 58], ["unpack_hook", CKPT, 1]], 8, "backward", 8),
         _stack([MAIN, ["main", "/home/u/t.py", 58]], 72, "backward", 72)],
        events=[{"kind": "compile", "step": s, "function": "f", "recompile_reason":
                 "x size mismatch at index 0" if s else None} for s in range(3)])
    # none of the three classes; the samples are the model's own work (the data wait, a
    # fifth, stays under every bar): that is said, with none of the classes' advice
    cause = slow_cause(evidence)
    assert cause is not None and cause["kind"] == "model-compute", cause
    for said in (next_action("SLOW", VerdictFacts(), None),
                 next_action("SLOW", VerdictFacts.of({"slow_cause": cause}), None)):
        assert "num_workers" not in said and "dynamic=True" not in said and \
            "Checkpoint" not in said


def test_a_loaded_run_waiting_for_batches_under_half_is_data_bound_when_it_is_the_largest():
    # the loaded slow_storage_loader.py run: 56 of 114 samples in `__next__`, 43 in the
    # backward, 15 in the forward's own work; the burners slowed the model, not the reads
    evidence = _evidence([_stack([MAIN, LOOP, ["__next__", DATA, 733]], 56, "forward", 4),
                          _stack([MAIN, ["main", "/home/u/train.py", 52]], 15, "forward", 15),
                          _stack([MAIN, ["main", "/home/u/train.py", 60]], 43, "backward", 40)],
                         others=[_worker(0, True, False), _worker(1, True, False)])
    cause = slow_cause(evidence)
    assert cause is not None and cause["kind"] == "data-bound"
    assert cause["share"] == pytest.approx(56 / 114)
    assert cause["largest_other"] == {"phase": "backward", "samples": 43}
    assert "in 49% of its samples" in cause["sentence"]
    assert "under half but more than any other phase outside it (the backward phase: 43 " \
           "samples, 38%)" in cause["sentence"]
    said = next_action("SLOW", VerdictFacts.of({"slow_cause": cause}), None)
    assert "A faster model will not help" in said and "make its body cheaper" not in said


@pytest.mark.parametrize(("waiting", "forward", "backward"), [(56, 1, 57), (44, 40, 30)],
                         ids=str)
def test_a_wait_under_half_is_no_cause_when_another_phase_outweighs_it_or_it_is_small(
        waiting, forward, backward):
    # 56 of 114 samples waiting but 57 in the backward: the model's work is as large; 44
    # of 114 (39%) is the largest phase but under DATA_LARGEST_SHARE
    evidence = _evidence([_stack([MAIN, LOOP, ["__next__", DATA, 733]], waiting, "forward", 2),
                          _stack([MAIN, ["main", "/home/u/train.py", 52], MODULE], forward,
                                 "forward", forward),
                          _stack([MAIN, ["main", "/home/u/train.py", 60]], backward,
                                 "backward", backward)])
    assert slow_cause(evidence) is None
