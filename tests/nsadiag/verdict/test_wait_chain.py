"""The wait chain (nsadiag.verdict.chain) built from evidence written out by hand: each hop
from a fact of the evidence, unknown where the evidence is silent; and the probes it reads
(the with-blocks around a line, /proc/locks and syscall lines)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from nsadiag.evidence import (
    Evidence,
    ProcessOutcome,
    StackFrame,
    StackSample,
    StallEvidence,
    ThreadStack,
)
from nsadiag.probes.scopes import enclosing
from nsadiag.probes.waits import (
    FileLock,
    OpenFile,
    ProcessWaits,
    Scope,
    SocketEnd,
    ThreadWait,
    parse_locks,
    parse_net_inet,
    parse_net_unix,
    parse_syscall,
    read_waits,
    reads_terminal,
)
from nsadiag.verdict.chain import wait_chain
from nsadiag.verdict.waits.model import WaitChain
from nsadiag.waitfacts import EndedProcess, PipeWriter

TRAIN = "/home/u/train.py"


def frame(function: str, line: int, code: str, file: str = TRAIN) -> StackFrame:
    return StackFrame(function, file, line, code=code)


def thread(tid: int, name: str, *frames: StackFrame) -> ThreadStack:
    return ThreadStack(tid, name, list(frames), os_thread_id=tid, active=False)


def evidence(threads: list[ThreadStack], waits: ProcessWaits | None,
             died: list[dict] | None = None, others: list[dict] | None = None,
             pid: int = 100) -> Evidence:
    stall = StallEvidence(6.0, 2.0, 0.0, samples=[StackSample(1.0, pid, threads)], waits=waits)
    return Evidence({"command": ["python", "train.py"]}, [], {}, None,
                    ProcessOutcome(None, 9, "SIGKILL", True, "stall"), stall, None, 0,
                    thread_exceptions=died or [], others=others or [])


def roundtrip(chain: WaitChain | None) -> WaitChain:
    assert chain is not None
    assert WaitChain.from_dict(chain.to_dict()) == chain
    return chain


def test_two_locks_in_opposite_order_are_a_cycle_naming_both_threads_and_lines():
    main = thread(100, "MainThread", frame("main", 51, "with stats_lock:"))
    logger = thread(101, "logger", frame("log", 31, "with model_lock:"))
    scopes = (Scope(100, TRAIN, "main", 51, (("model_lock", 46),)),
              Scope(101, TRAIN, "log", 31, (("stats_lock", 28),)))
    chain = roundtrip(wait_chain(evidence([main, logger], ProcessWaits(100, (), scopes=scopes))))
    assert chain.end == "lock-cycle"
    assert chain.printed() == (
        "the main thread waits for `stats_lock` at train.py:51 -> `stats_lock` is held by "
        "thread logger (inside `with stats_lock:` at train.py:28) -> thread logger waits for "
        "`model_lock` at train.py:31, which the main thread holds (inside `with model_lock:` "
        "at train.py:46): each waits for the other")


def test_a_lock_no_live_thread_holds_is_said_so_and_in_a_forked_worker_blamed_on_the_fork():
    main = thread(100, "MainThread", frame("main", 51, "with stats_lock:"))
    alone = roundtrip(wait_chain(evidence([main], ProcessWaits(100, ()))))
    assert alone.end == "lock-lost" and "no live thread" in alone.printed()
    # the scopes were not read: the holder is unknown, not "no one"
    unread = roundtrip(wait_chain(evidence([main], None)))
    assert unread.end == "unknown" and "unknown" in unread.hops[-1].text
    loader = thread(100, "MainThread", frame("main", 61, "for batch in loader:"),
                    frame("_get_data", 1, "idx, data = self._get_data()",
                          "/venv/site-packages/torch/utils/data/dataloader.py"))
    loader.frames.insert(0, frame("wait", 320, "waiter.acquire()", "/usr/lib/python3.11/"
                                  "threading.py"))
    worker = thread(200, "MainThread", frame("__getitem__", 43, "with self.lock:"))
    other = {"pid": 200, "role": "DataLoader worker 0 of the main process", "stall": (
        StallEvidence(6.0, 2.0, 0.0, samples=[StackSample(1.0, 200, [worker])],
                      waits=ProcessWaits(200, ())).to_dict())}
    forked = roundtrip(wait_chain(evidence([loader], ProcessWaits(100, ()), others=[other])))
    assert forked.end == "lock-lost-fork"
    assert forked.printed().startswith(
        "the main thread waits for a batch from the DataLoader at train.py:61 -> DataLoader "
        "worker 0 of the main process (pid 200) waits for `self.lock` at train.py:43 -> ")
    assert "locked when the process was forked" in forked.printed()


def test_a_queue_whose_producer_died_names_the_exception_and_one_without_names_no_producer():
    get = thread(100, "MainThread", frame("wait", 320, "waiter.acquire()",
                                          "/usr/lib/python3.11/threading.py"),
                 frame("main", 47, "batch = batches.get()"))
    died = [{"thread": "producer", "type": "ValueError", "message": "bad record",
             "where": "parse (train.py:30)"}]
    chain = roundtrip(wait_chain(evidence([get], ProcessWaits(100, ()), died=died)))
    assert chain.end == "producer-died" and chain.subject == "batches"
    assert chain.printed() == ("the main thread waits for an item from `batches` at "
                               "train.py:47 -> thread producer died of ValueError: bad record "
                               "at parse (train.py:30)")
    nobody = roundtrip(wait_chain(evidence([get], ProcessWaits(100, ()))))
    assert nobody.end == "no-producer" and "no other thread" in nobody.printed()


def test_a_thread_join_is_followed_into_the_joined_thread_and_a_queue_join_is_not():
    joins = thread(100, "MainThread",
                   frame("_wait_for_tstate_lock", 1132, "if lock.acquire(block, timeout):",
                         "/usr/lib/python3.11/threading.py"),
                   frame("Thread.join", 1112, "self._wait_for_tstate_lock()",
                         "/usr/lib/python3.11/threading.py"),
                   frame("<module>", 16, "t.join()"))
    consumer = thread(101, "consumer", frame("wait", 320, "waiter.acquire()",
                                             "/usr/lib/python3.11/threading.py"),
                      frame("consume", 7, "item = jobs.get()"))
    chain = roundtrip(wait_chain(evidence([joins, consumer], ProcessWaits(100, ()))))
    assert chain.end == "no-producer" and chain.subject == "jobs"
    assert chain.printed().startswith(
        "the main thread waits for thread `t` to finish at train.py:16 -> thread consumer "
        "waits for an item from `jobs` at train.py:7 -> which thread feeds it is unknown")
    # two other threads: which one `t` is, is not in the evidence
    other = thread(102, "logger", frame("run", 40, "time.sleep(1)"))
    two = roundtrip(wait_chain(evidence([joins, consumer, other], ProcessWaits(100, ()))))
    assert two.end == "unknown" and "which live thread is `t` is unknown" in two.printed()
    assert "thread consumer" in two.printed() and "thread logger" in two.printed()
    # a queue's join (queue.py, waiting for task_done) stays a queue wait
    queue_join = thread(100, "MainThread", frame("wait", 320, "waiter.acquire()",
                                                 "/usr/lib/python3.11/threading.py"),
                        frame("Queue.join", 90, "self.all_tasks_done.wait()",
                              "/usr/lib/python3.11/queue.py"),
                        frame("<module>", 20, "jobs.join()"))
    waited = roundtrip(wait_chain(evidence([queue_join, consumer], ProcessWaits(100, ()))))
    assert waited.printed().startswith("the main thread waits for `jobs` to finish at "
                                       "train.py:20 -> ")


def test_a_sampled_child_is_followed_into_its_threads_and_a_fork_is_blamed_only_on_a_fork():
    join = thread(100, "MainThread", frame("wait", 44, "pid, sts = os.waitpid(self.pid, flag)",
                                           "/usr/lib/python3.11/multiprocessing/popen_fork.py"),
                  frame("main", 62, "proc.join()"))
    parent_command = ("python", "train.py")

    def run(child_command, child_frames):
        child = ProcessWaits(300, child_command, (ThreadWait(300, "futex_do_wait", 202,
                                                             "futex", 0),))
        ours = ProcessWaits(100, parent_command, (ThreadWait(100, "do_wait", 61, "wait4", 300),),
                            (), (child,))
        stuck = thread(300, "MainThread", *child_frames)
        other = {"pid": 300, "role": "a helper process", "stall": StallEvidence(
            6.0, 2.0, 0.0, samples=[StackSample(1.0, 300, [stuck])],
            waits=child).to_dict()}
        return roundtrip(wait_chain(evidence([join], ours, others=[other])))

    evaluate = frame("evaluate", 42, "with METRICS_LOCK:")
    # a fork copies the parent's command and its stack down to the call that forked it
    copied = [evaluate, frame("_launch", 71, "code = process_obj._bootstrap()",
                              "/usr/lib/python3.11/multiprocessing/popen_fork.py"),
              frame("main", 61, "proc.start()")]
    forked = run(parent_command, copied)
    assert forked.end == "lock-lost-fork" and forked.subject == "METRICS_LOCK"
    assert "-> in pid 300 (forked from this process, no exec), the main thread waits for " \
           "`METRICS_LOCK` at train.py:42 -> " in forked.printed()
    assert "locked when the process was forked" in forked.printed()
    # a spawned child (its own command, no fork on its stack): the same wait, no fork blamed
    spawned = run(("python", "-c", "from multiprocessing.spawn import spawn_main"),
                  [evaluate])
    assert spawned.end == "lock-lost" and "fork" not in spawned.printed()
    assert "-> in pid 300, the main thread waits for `METRICS_LOCK`" in spawned.printed()
    # a child whose own stack names nothing of the user's: its kernel wait, as before
    unnamed = run(("python", "-c", "pass"), [frame("wait", 320, "waiter.acquire()",
                                                   "/usr/lib/python3.11/threading.py")])
    assert unnamed.end == "child-waits" and unnamed.printed().endswith(
        "pid 300 waits in the kernel at futex_do_wait")
    # a Process.join read without the kernel's word on the thread (as `nsadiag attach` may
    # read it) waits for the child too, never for a queue named after the process
    blind = ProcessWaits(100, parent_command, (), (), (ProcessWaits(300, ("python",)),))
    joined = thread(100, "MainThread", frame("wait", 44, "pid, sts = os.waitpid(self.pid, 0)",
                                             "/usr/lib/python3.11/multiprocessing/"
                                             "popen_fork.py"),
                    frame("main", 62, "p.join()"))
    child_wait = roundtrip(wait_chain(evidence([joined], blind)))
    assert child_wait.hops[0].kind == "child" and "feeds" not in child_wait.printed()
    assert child_wait.end != "no-producer"


def test_a_child_reading_a_pipe_whose_write_end_we_hold_is_a_pipe_that_never_ends():
    wait = thread(100, "MainThread", frame("_try_wait", 1959, "(pid, sts) = os.waitpid()",
                                           "/usr/lib/python3.11/subprocess.py"),
                  frame("dedupe", 27, "sorter.wait()"))
    child = ProcessWaits(300, ("sort", "-u"), (ThreadWait(300, "pipe_read", 0, "read", 0),),
                         (OpenFile(0, "pipe:[77]", "r", 77),))
    ours = ProcessWaits(100, ("python",), (ThreadWait(100, "do_wait", 61, "wait4", 300),),
                        (OpenFile(10, "pipe:[77]", "w", 77),), (child,))
    chain = roundtrip(wait_chain(evidence([wait], ours)))
    assert chain.end == "pipe-eof" and chain.subject == "sort -u"
    assert chain.printed() == (
        "the main thread waits for child pid 300 (`sort -u`) to exit at train.py:27 -> pid "
        "300 is blocked reading fd 0 (its stdin), pipe:[77], a pipe whose write end this "
        "process holds (fd 10) and never closed: it never reaches end of file")
    # the same child reading a pipe someone else writes: blocked, but no pipe claim
    theirs = ProcessWaits(100, ("python",), ours.threads, (), (child,))
    other = roundtrip(wait_chain(evidence([wait], theirs)))
    assert other.end == "child-waits" and "write end" not in other.printed()


SITE = "/venv/lib/python3.11/site-packages/torch"


def test_a_read_of_a_childs_output_is_followed_to_the_child_and_inside_a_compile_named_so():
    # torch.compile's C++ build reads its compiler's output (subprocess.run); the compiler
    # (a wrapper that never answers) sleeps: the read is of a pipe the child writes
    reading = thread(100, "MainThread",
                     StackFrame("read", "/usr/lib/x86_64-linux-gnu/libc.so.6", 0, True),
                     frame("communicate", 1196, "stdout = self.stdout.read()",
                           "/usr/lib/python3.11/subprocess.py"),
                     frame("cpp_compiler_search", 104, "subprocess.check_output(...)",
                           f"{SITE}/_inductor/cpp_builder.py"),
                     frame("compile_fx_inner", 837, "", f"{SITE}/_inductor/compile_fx.py"),
                     frame("_compile", 2102, "", f"{SITE}/_dynamo/convert_frame.py"),
                     frame("main", 5, "print(model(x).sum())"))
    compiler = ProcessWaits(300, ("sleep", "9"),
                            (ThreadWait(300, "hrtimer_nanosleep", 230, "clock_nanosleep", 0),),
                            (OpenFile(1, "pipe:[77]", "w", 77),))
    ours = ProcessWaits(100, ("python",), (ThreadWait(100, "anon_pipe_read", 0, "read", 10),),
                        (OpenFile(10, "pipe:[77]", "r", 77),), (compiler,))
    chain = roundtrip(wait_chain(evidence([reading], ours)))
    assert chain.end == "compile-cxx" and chain.subject == "sleep 9"
    assert chain.printed() == (
        "the main thread waits to read the output of child pid 300 (`sleep 9`) inside "
        "torch.compile (cpp_compiler_search at cpp_builder.py:104) at train.py:5 -> pid 300 "
        "waits in the kernel at hrtimer_nanosleep")
    # the same read outside any compile: a child that never exits, nothing of torch.compile
    plain = thread(100, "MainThread", *reading.frames[:2],
                   frame("main", 9, "out = subprocess.run(cmd, capture_output=True)"))
    outside = roundtrip(wait_chain(evidence([plain], ours)))
    assert outside.end == "child-waits" and "torch.compile" not in outside.printed()
    assert outside.printed().startswith("the main thread waits to read the output of child "
                                        "pid 300 (`sleep 9`) at train.py:9 -> ")
    # a pipe no child writes is not a child's output: no child is named
    nobody = ProcessWaits(100, ("python",), ours.threads, ours.files,
                          (ProcessWaits(300, ("sleep", "9"), compiler.threads, ()),))
    assert "child pid" not in roundtrip(wait_chain(evidence([plain], nobody))).printed()


def test_a_read_of_the_terminal_is_a_prompt_waiting_for_its_answer():
    prompt = thread(100, "MainThread", frame("main", 5, "answer = input('overwrite? [y/N] ')"))
    ours = ProcessWaits(100, ("python",), (ThreadWait(100, "n_tty_read", 0, "read", 0),),
                        (OpenFile(0, "/dev/pts/3", "rw", 6),))
    chain = roundtrip(wait_chain(evidence([prompt], ours)))
    assert chain.end == "terminal-input" and chain.subject == "/dev/pts/3"
    assert chain.printed() == ("the main thread waits for a line typed at the terminal "
                               "(/dev/pts/3, fd 0, its stdin) at train.py:5")
    # stdin from a file or /dev/null is no terminal
    piped = ProcessWaits(100, ("python",), ours.threads, (OpenFile(0, "/data/in.txt", "r", 9),))
    assert roundtrip(wait_chain(evidence([prompt], piped))).end != "terminal-input"


def test_a_prompt_in_a_thread_the_main_thread_joins_is_named_through_the_join():
    joins = thread(100, "MainThread",
                   frame("Thread._wait_for_tstate_lock", 1132, "if lock.acquire(block, timeout):",
                         "/usr/lib/python3.11/threading.py"),
                   frame("Thread.join", 1112, "self._wait_for_tstate_lock()",
                         "/usr/lib/python3.11/threading.py"),
                   frame("main", 20, "asker.join()"))
    asker = thread(104, "asker", frame("ask", 9, "answer = input('overwrite? [y/N] ')"))
    ours = ProcessWaits(100, ("python",), (ThreadWait(100, "futex_do_wait", 202, "futex", 0),
                                           ThreadWait(104, "n_tty_read", 0, "read", 0)),
                        (OpenFile(0, "/dev/pts/3", "rw", 6),))
    chain = roundtrip(wait_chain(evidence([joins, asker], ours)))
    assert chain.end == "terminal-input" and chain.subject == "/dev/pts/3"
    assert chain.printed() == (
        "the main thread waits for thread `asker` to finish at train.py:20 -> thread asker "
        "waits for a line typed at the terminal (/dev/pts/3, fd 0, its stdin) at train.py:9")


def test_an_output_held_open_after_its_child_ended_names_the_child_and_the_holder():
    reads = thread(100, "MainThread",
                   frame("Popen.communicate", 1196, "stdout = self.stdout.read()",
                         "/usr/lib/python3.11/subprocess.py"),
                   frame("run", 550, "stdout, stderr = process.communicate(input, timeout=t)",
                         "/usr/lib/python3.11/subprocess.py"),
                   frame("main", 12, "out = subprocess.run(start, stdout=subprocess.PIPE)"))
    read = (ThreadWait(100, "pipe_read", 0, "read", 5),)
    pipe = (OpenFile(5, "pipe:[70]", "r", 70),)
    holder = PipeWriter(70, 301, ("/usr/bin/python", "/srv/serve.py"), 1)
    ours = ProcessWaits(100, ("python", "train.py"), read, pipe,
                        ended=(EndedProcess(300, "sh", 0),), pipe_writers=(holder,))
    chain = roundtrip(wait_chain(evidence([reads], ours)))
    assert chain.end == "pipe-held" and chain.subject == "python serve.py"
    assert chain.printed() == (
        "the main thread waits to read the output of child pid 300 (`sh`) at train.py:12 -> "
        "pid 300 ended (exited with code 0) -> but the write end of its output (pipe:[70]) "
        "is still open in pid 301 (`python serve.py`, fd 1): the read never reaches end of "
        "file while it is")
    # a pipe read outside subprocess: the read and the holder, no child claimed
    plain = thread(100, "MainThread", frame("main", 20, "line = os.read(fd, 100)"))
    bare = roundtrip(wait_chain(evidence([plain], ours)))
    assert bare.end == "pipe-held" and "child" not in bare.printed()
    assert bare.printed().startswith("the main thread waits to read fd 5, pipe:[70] at "
                                     "train.py:20 -> its write end is open in pid 301")


def test_a_child_that_ended_and_a_process_it_left_holding_its_output_are_read_from_proc():
    import subprocess
    import sys
    import time

    runs = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run("
                             "['sh', '-c', 'sleep 60 & exit 3'], stdout=subprocess.PIPE)"])
    left: list[int] = []
    try:
        end, waits = time.monotonic() + 60, None
        while time.monotonic() < end:
            waits = read_waits(runs.pid)
            if waits.ended and waits.pipe_writers:
                break
            time.sleep(0.1)
        assert waits is not None
        left = [w.pid for w in waits.pipe_writers]
        assert [(e.name, e.returncode) for e in waits.ended] == [("sh", 3)]
        assert [(w.command, w.fd) for w in waits.pipe_writers] == [(("sleep", "60"), 1)]
        assert not waits.children  # the ended child is not read as a live one
    finally:
        for pid in left:
            os.kill(pid, 9)
        runs.kill()
        runs.wait()


def test_a_file_lock_is_followed_to_its_holder_by_proc_locks():
    main = thread(100, "MainThread", frame("main", 40, "fcntl.flock(cache, fcntl.LOCK_SH)"))
    locks = (FileLock("FLOCK", "WRITE", 200, 9, False, "/tmp/cache.bin"),
             FileLock("FLOCK", "READ", 100, 9, True, "/tmp/cache.bin"))
    ours = ProcessWaits(100, (), (ThreadWait(100, "locks_lock_inode_wait", 73, "flock", 3),),
                        locks=locks)
    holder = thread(200, "MainThread", frame("warm", 28, "may_write.wait()"))
    other = {"pid": 200, "role": "a helper process", "stall": StallEvidence(
        6.0, 2.0, 0.0, samples=[StackSample(1.0, 200, [holder])],
        waits=ProcessWaits(200, ("python", "warm.py"))).to_dict()}
    chain = roundtrip(wait_chain(evidence([main], ours, others=[other])))
    assert chain.end == "file-lock" and chain.subject == "/tmp/cache.bin"
    assert chain.printed() == (
        "the main thread waits for the flock lock on /tmp/cache.bin at train.py:40 -> it is "
        "held (write) by pid 200 (`python warm.py`), by /proc/locks -> pid 200: the main "
        "thread waits at train.py:28 `may_write.wait()`")


MP = "/usr/lib/python3.11/multiprocessing"


def _pool_worker(pid: int, name: str, *task: StackFrame) -> dict:
    """A forked pool worker as sampled: its task's frames (if any) inside the worker loop,
    below them the parent's frames that created the pool."""
    loop = thread(pid, name, *task,
                  frame("SimpleQueue.get", 364, "with self._rlock:", f"{MP}/queues.py"),
                  frame("worker", 114, "task = get()", f"{MP}/pool.py"),
                  frame("Pool.__init__", 215, "self._repopulate_pool()", f"{MP}/pool.py"),
                  frame("main", 33, "with Pool(2) as pool:"))
    if task:  # a worker inside its task is not in the queue's get
        loop = thread(pid, name, *task, *loop.frames[2:])
    return {"pid": pid, "role": "a multiprocessing pool worker", "stall": StallEvidence(
        6.0, 2.0, 0.0, samples=[StackSample(1.0, pid, [loop])],
        waits=ProcessWaits(pid, ("python", "prep.py"))).to_dict()}


def test_a_pool_whose_workers_all_wait_idle_lost_the_awaited_task_and_a_busy_one_is_followed():
    waits = thread(100, "MainThread", frame("wait", 327, "waiter.acquire()",
                                            "/usr/lib/python3.11/threading.py"),
                   frame("ApplyResult.wait", 765, "self._event.wait(timeout)", f"{MP}/pool.py"),
                   frame("Pool.map", 367, "return self._map_async(...).get()", f"{MP}/pool.py"),
                   frame("main", 34, "tokens = pool.map(tokenize, range(16))"))
    idle = [_pool_worker(201, "MainThread"), _pool_worker(205, "Thread-1 (_handle_workers)")]
    chain = roundtrip(wait_chain(evidence([waits], ProcessWaits(100, ()), others=idle)))
    assert chain.end == "pool-lost-task"
    assert chain.printed() == (
        "the main thread waits for the results of a multiprocessing pool at train.py:34 -> "
        "both its workers (pids 201, 205) wait idle for a task: none runs the task whose "
        "result this waits for; pid 205 was started by the pool's `_handle_workers` thread, "
        "which replaces a worker that ended")
    # a worker inside its task (the user's frame inside the worker loop) is followed
    busy = [_pool_worker(201, "MainThread"),
            _pool_worker(202, "MainThread", frame("tokenize", 22, "ids = vocab.encode(doc)"))]
    followed = roundtrip(wait_chain(evidence([waits], ProcessWaits(100, ()), others=busy)))
    assert followed.end == "pool-worker"
    assert followed.printed().startswith(
        "the main thread waits for the results of a multiprocessing pool at train.py:34 -> "
        "pool worker pid 202 ")
    assert "train.py:22" in followed.printed() and "idle" not in followed.printed()
    # no worker sampled: nothing is claimed about them
    alone = roundtrip(wait_chain(evidence([waits], ProcessWaits(100, ()))))
    assert alone.end == "unknown" and "no worker of the pool was sampled" in alone.printed()


def test_a_pool_worker_that_ended_is_named_with_its_exit_status_and_its_replacement():
    waits = thread(100, "MainThread", frame("wait", 327, "waiter.acquire()",
                                            "/usr/lib/python3.11/threading.py"),
                   frame("Pool.map", 367, "return self._map_async(...).get()", f"{MP}/pool.py"),
                   frame("main", 34, "tokens = pool.map(tokenize, range(16))"))
    idle = [_pool_worker(201, "MainThread"), _pool_worker(205, "Thread-1 (_handle_workers)")]
    killed = ProcessWaits(100, (), ended=(EndedProcess(202, "ForkPoolWorker-2", -9),))
    chain = roundtrip(wait_chain(evidence([waits], killed, others=idle)))
    assert chain.end == "pool-worker-ended" and chain.subject == "pool worker pid 202"
    assert chain.printed() == (
        "the main thread waits for the results of a multiprocessing pool at train.py:34 -> "
        "pool worker pid 202 ended (killed by SIGKILL) while it ran the task; the pool "
        "replaced it with pid 205, which never gets that task (the workers it has now wait "
        "idle)")
    # an exit code as the pool read it; a status no watched process read is said unknown
    exited = ProcessWaits(100, (), ended=(EndedProcess(202, "ForkPoolWorker-2", 3),))
    assert "pid 202 ended (exited with code 3) while" in wait_chain(
        evidence([waits], exited, others=idle)).printed()
    unknown = ProcessWaits(100, (), ended=(EndedProcess(202, "ForkPoolWorker-2", None),))
    assert "pid 202 ended (its exit status is not known: no watched process reaped it)" in \
        wait_chain(evidence([waits], unknown, others=idle)).printed()
    # a worker retired by maxtasksperchild (code 0) lost nothing, and a child that is no
    # pool worker is not one: the chain stays as it was without them
    for other in (EndedProcess(202, "ForkPoolWorker-2", 0), EndedProcess(203, "Process-1", -9)):
        plain = wait_chain(evidence([waits], ProcessWaits(100, (), ended=(other,)),
                                    others=idle))
        assert plain.end == "pool-lost-task" and "ended (" not in plain.printed()
    # a worker that runs a task is followed first: the task it runs is not lost
    busy = [_pool_worker(201, "MainThread"),
            _pool_worker(205, "MainThread", frame("tokenize", 22, "ids = vocab.encode(doc)"))]
    assert wait_chain(evidence([waits], killed, others=busy)).end == "pool-worker"


def test_a_child_exit_is_recorded_once_by_the_process_that_reaps_it(tmp_path):
    import multiprocessing
    import signal

    from nsadiag.harness import child_exits
    path = tmp_path / child_exits.FILE_NAME
    uninstall = child_exits.install(path)
    try:
        context = multiprocessing.get_context("fork")
        worker = context.Process(target=int, name="ForkPoolWorker-7")
        worker.start()
        worker.join()
        killed = context.Process(target=signal.pause)
        killed.start()
        os.kill(killed.pid, signal.SIGKILL)
        killed.join()
        assert killed.exitcode == -signal.SIGKILL  # read again: recorded once
    finally:
        uninstall()
    recorded = child_exits.read(path)
    assert recorded == (EndedProcess(worker.pid, "ForkPoolWorker-7", 0),
                        EndedProcess(killed.pid, killed.name, -9))
    assert recorded[1].status() == "killed by SIGKILL"
    assert child_exits.read(tmp_path / "absent.jsonl") == ()


IND = "/venv/lib/python3.11/site-packages/torch/_inductor"
PY = "/usr/lib/python3.11"
SIDECAR = ("/venv/bin/python", f"{IND}/compile_worker/__main__.py", "--kind=fork",
           "--workers=2")


def _awaits_compile_job(tid: int, name: str = "MainThread") -> ThreadStack:
    """A thread waiting for a job of inductor's compile workers, as py-spy showed it (torch
    2.13: AsyncCompile.wait, which torch.compile's generated module calls)."""
    return thread(tid, name, frame("Condition.wait", 327, "waiter.acquire()",
                                   f"{PY}/threading.py"),
                  frame("Future.result", 451, "self._condition.wait(timeout)",
                        f"{PY}/concurrent/futures/_base.py"),
                  frame("AsyncCompile._wait_futures", 848,
                        "kernel = result.result(timeout=wait_timeout)",
                        f"{IND}/async_compile.py"),
                  frame("AsyncCompile.wait", 818, "self._wait_futures(scope)",
                        f"{IND}/async_compile.py"),
                  frame("main", 29, "loss = (compiled(x) - x).pow(2).mean()"))


def _cxx_build(*outer: StackFrame) -> list[StackFrame]:
    """The frames of inductor's C++ build waiting for its compiler (as py-spy showed them),
    inside ``outer``."""
    return [frame("Popen.communicate", 1196, "stdout, stderr = self._communicate(...)",
                  f"{PY}/subprocess.py"),
            frame("run", 550, "stdout, stderr = process.communicate(input, timeout=timeout)",
                  f"{PY}/subprocess.py"),
            frame("_run_compile_cmd", 696, "subprocess.run(cmd, ...)", f"{IND}/cpp_builder.py"),
            frame("CppBuilder.build", 2571, "run_compile_cmd(build_cmd, cwd=_build_dir)",
                  f"{IND}/cpp_builder.py"),
            frame("_worker_compile_cpp", 2890, "builder.build()", f"{IND}/codecache.py"),
            *outer]


def _compiler(pid: int, reader: int) -> tuple[ProcessWaits, ThreadWait, OpenFile]:
    """A compiler child blocked in the kernel, whose output ``reader`` reads on fd 12."""
    child = ProcessWaits(pid, ("/bin/sh", "cxx.sh", "k.cpp"), (ThreadWait(pid, "do_wait"),),
                         (OpenFile(1, "pipe:[90]", "w", 90),))
    return child, ThreadWait(reader, "pipe_read", 0, "read", 12), OpenFile(12, "pipe:[90]", "r", 90)


def _compile_worker(pid: int, *job: StackFrame, waits: ProcessWaits | None = None) -> dict:
    """A process inductor's compile-worker process forked, as sampled: in a job (``job``)
    or waiting for one."""
    loop = [frame("_process_worker", 261 if job else 249, "",
                  f"{PY}/concurrent/futures/process.py"),
            frame("BaseProcess.run", 108, "", f"{PY}/multiprocessing/process.py"),
            frame("SubprocMain.main", 380, "self.submit(job_id, data)",
                  f"{IND}/compile_worker/subproc_pool.py")]
    waiting = [frame("Connection._recv", 395, "chunk = read(handle, remaining)",
                     f"{PY}/multiprocessing/connection.py"),
               frame("Queue.get", 103, "res = self._recv_bytes()",
                     f"{PY}/multiprocessing/queues.py")]
    frames = [*job, *loop] if job else [*waiting, *loop]
    return {"pid": pid, "role": "a helper process", "stall": StallEvidence(
        6.0, 2.0, 0.0, samples=[StackSample(1.0, pid, [thread(pid, "MainThread", *frames)])],
        waits=waits or ProcessWaits(pid, SIDECAR)).to_dict()}


def test_a_wait_for_a_compile_job_is_followed_to_the_worker_that_runs_it():
    compiler, read, pipe = _compiler(600, 5079)
    busy = _compile_worker(5079, *_cxx_build(frame(
        "SubprocMain.do_job", 475, "result = job()", f"{IND}/compile_worker/subproc_pool.py")),
        waits=ProcessWaits(5079, SIDECAR, (read,), (pipe,), (compiler,)))
    idle = _compile_worker(5081)
    sidecar = ProcessWaits(5006, SIDECAR, children=(ProcessWaits(5079, SIDECAR),
                                                    ProcessWaits(5081, SIDECAR)))
    main = ProcessWaits(100, ("python", "train.py"), children=(sidecar,))
    chain = roundtrip(wait_chain(evidence([_awaits_compile_job(100)], main,
                                          others=[idle, busy])))
    assert chain.end == "compile-cxx" and chain.subject == "/bin/sh cxx.sh k.cpp"
    assert chain.printed() == (
        "the main thread waits for a job of torch.compile's compile workers (inductor's "
        "compile-worker process, pid 5006) at train.py:29 -> compile worker pid 5079 waits to "
        "read the output of child pid 600 (`/bin/sh cxx.sh k.cpp`) in torch.compile's C++ "
        "build (_run_compile_cmd at cpp_builder.py:696) -> pid 600 waits in the kernel at "
        "do_wait")
    # a job that is no C++ build: the worker's own frame is where the chain ends
    sleeping = _compile_worker(5079, frame("SubprocMain.do_job", 475, "result = job()",
                                           f"{IND}/compile_worker/subproc_pool.py"))
    plain = roundtrip(wait_chain(evidence([_awaits_compile_job(100)], main,
                                          others=[idle, sleeping])))
    assert plain.end == "compile-worker", plain.printed()
    assert plain.printed().endswith(
        "-> compile worker pid 5079 is inside its job at subproc_pool.py:475 `result = job()`")
    # every worker waiting for a job: said so, and no cause named
    both_idle = roundtrip(wait_chain(evidence([_awaits_compile_job(100)], main,
                                              others=[idle, _compile_worker(5079)])))
    assert both_idle.end == "unknown" and both_idle.printed().endswith(
        "every compile worker sampled (pid 5081, pid 5079) waits idle for a job: none runs "
        "the one awaited")
    # the workers not sampled: unknown, the compile-worker process still named
    unseen = wait_chain(evidence([_awaits_compile_job(100)], main))
    assert unseen.end == "unknown" and "pid 5006" in unseen.printed() and \
        "its workers were not sampled" in unseen.printed()


def test_a_wait_for_a_compile_job_run_by_a_compile_thread_follows_that_thread():
    # on a CPU inductor builds C++ kernels in threads of the process (a ThreadPoolExecutor)
    compiler, read, pipe = _compiler(600, 104)
    worker = thread(104, "ThreadPoolExecutor-0_0", *_cxx_build(
        frame("_WorkItem.run", 58, "result = self.fn(*self.args, **self.kwargs)",
              f"{PY}/concurrent/futures/thread.py"),
        frame("_worker", 83, "work_item.run()", f"{PY}/concurrent/futures/thread.py")))
    spare = thread(105, "ThreadPoolExecutor-0_1",
                   frame("Queue.get", 171, "self.not_empty.wait()", f"{PY}/queue.py"),
                   frame("_worker", 81, "work_item = work_queue.get(block=True)",
                         f"{PY}/concurrent/futures/thread.py"))
    main = ProcessWaits(100, ("python", "train.py"), (read,), (pipe,), (compiler,))
    chain = roundtrip(wait_chain(evidence([_awaits_compile_job(100), spare, worker], main)))
    assert chain.end == "compile-cxx", chain.printed()
    assert chain.printed() == (
        "the main thread waits for a job of torch.compile's compile workers at train.py:29 "
        "-> thread ThreadPoolExecutor-0_0 waits to read the output of child pid 600 "
        "(`/bin/sh cxx.sh k.cpp`) in torch.compile's C++ build (_run_compile_cmd at "
        "cpp_builder.py:696) -> pid 600 waits in the kernel at do_wait")


def test_a_sleep_loop_names_what_it_polls_and_an_unnamed_wait_stays_unknown():
    sleep = thread(100, "MainThread", frame("wait_for_eval", 24, "time.sleep(0.2)"))
    scopes = (Scope(100, TRAIN, "wait_for_eval", 24, (),
                    ("while not os.path.exists(marker):", 23)),)
    chain = roundtrip(wait_chain(evidence([sleep], ProcessWaits(100, (), scopes=scopes))))
    assert chain.end == "poll" and chain.subject == "not os.path.exists(marker)"
    assert chain.hops[0].where == "train.py:23"
    # a sleep in a `for` loop (or in straight code) waits for its time, not for a condition
    nap = thread(100, "MainThread", frame("main", 8, "time.sleep(3_600)  # from debugging"))
    in_for = (Scope(100, TRAIN, "main", 8, (), ("for step in range(100):", 4)),)
    slept = roundtrip(wait_chain(evidence([nap], ProcessWaits(100, (), scopes=in_for))))
    assert slept.end == "sleep" and slept.subject == "time.sleep(3_600)"
    assert slept.printed() == ("the main thread sleeps at train.py:8 `time.sleep(3_600)  # "
                               "from debugging` (3600 s, as written)")
    assert "polls" not in slept.printed()
    odd = thread(100, "MainThread", frame("main", 12, "result = future.result()"))
    unknown = roundtrip(wait_chain(evidence([odd], ProcessWaits(100, ()))))
    assert unknown.end == "unknown" and unknown.hops[-1].kind == "unknown"


def test_the_with_blocks_around_a_line_are_read_from_the_source(tmp_path):
    source = tmp_path / "t.py"
    source.write_text("def f(a, b):\n"
                      "    while True:\n"
                      "        with a:\n"
                      "            with b:\n"
                      "                pass\n"
                      "\n"
                      "def g(c):\n"
                      "    with c:\n"
                      "        pass\n")
    assert enclosing(str(source), 3) == ((), ("while True:", 2))  # waiting to enter a
    assert enclosing(str(source), 4) == ((("a", 3),), ("while True:", 2))
    assert enclosing(str(source), 5) == ((("a", 3), ("b", 4)), ("while True:", 2))
    assert enclosing(str(source), 9) == ((("c", 8),), None)
    assert enclosing(str(tmp_path / "missing.py"), 1) is None


def test_proc_locks_and_syscall_lines_are_parsed():
    text = ("1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF\n"
            "1: -> FLOCK  ADVISORY  READ  4343 08:01:1234 0 EOF\n"
            "2: POSIX  ADVISORY  WRITE 77 00:2b:99 0 EOF\n")
    assert parse_locks(text) == [("FLOCK", "WRITE", 4242, 1234, False),
                                 ("FLOCK", "READ", 4343, 1234, True),
                                 ("POSIX", "WRITE", 77, 99, False)]
    assert parse_syscall("0 0x3 0x7ffd 0x1 0x0 0x0 0x0 0x7ffd 0x7f") == (0, 3)
    assert parse_syscall("running") == (None, None)
    assert parse_syscall("-1 0x7ffd 0x7f") == (None, None)


def _reading(fd: int, ends: tuple[SocketEnd, ...]) -> tuple[ThreadStack, ProcessWaits]:
    main = thread(100, "MainThread", frame("score", 68, "with urlopen(request) as reply:"))
    return main, ProcessWaits(100, ("python",), (ThreadWait(100, "wait_woken", 45, "recvfrom",
                                                            fd),),
                              (OpenFile(fd, "socket:[55]", "rw", 55),), sockets=ends)


def test_a_read_on_a_socket_is_followed_to_the_process_holding_the_other_end():
    server = ("/venv/bin/python", "/home/u/serve.py", "8123")
    end = SocketEnd(9, 55, "tcp", "127.0.0.1:40100", "127.0.0.1:8123", "ESTABLISHED", 200,
                    server, ThreadWait(200, "wait_woken", 45, "recvfrom", 4), True)
    main, ours = _reading(9, (end,))
    handler = thread(200, "MainThread", frame("do_POST", 32, "body = self.rfile.read()",
                                              "/home/u/serve.py"))
    other = {"pid": 200, "role": "a watched process", "stall": StallEvidence(
        6.0, 2.0, 0.0, samples=[StackSample(1.0, 200, [handler])]).to_dict()}
    chain = roundtrip(wait_chain(evidence([main], ours, others=[other])))
    assert chain.end == "socket-peer" and chain.subject == "python serve.py 8123"
    assert chain.printed() == (
        "the main thread waits to read fd 9, a TCP connection from 127.0.0.1:40100 to "
        "127.0.0.1:8123 at train.py:68 -> the other end (127.0.0.1:8123) is held by pid 200 "
        "(`python serve.py 8123`) -> pid 200: the main thread waits to read the same "
        "connection at serve.py:32 `body = self.rfile.read()`: each end waits for the other "
        "to send")
    # not sampled: where its first thread waits in the kernel, and no more
    unsampled = roundtrip(wait_chain(evidence([main], ours)))
    assert unsampled.hops[-1].text == ("pid 200's main thread waits in the kernel at "
                                       "wait_woken (its Python stack was not sampled)")


def test_a_socket_whose_other_end_is_out_of_sight_says_so_and_guesses_no_peer():
    remote = SocketEnd(9, 55, "tcp", "10.0.0.2:40100", "10.0.0.9:6379")
    main, ours = _reading(9, (remote,))
    chain = roundtrip(wait_chain(evidence([main], ours)))
    assert chain.end == "socket-remote" and chain.subject == "10.0.0.9:6379"
    assert chain.hops[-1].text == ("the other end, 10.0.0.9:6379, is on another machine: "
                                   "what it does is not visible from here")
    unix = SocketEnd(9, 55, "unix", "/run/app.sock")
    main, ours = _reading(9, (unix,))
    chain = roundtrip(wait_chain(evidence([main], ours)))
    assert chain.end == "unknown" and "a Unix socket (/run/app.sock)" in chain.printed()
    # a read on a descriptor that is not a socket is no socket hop
    main, ours = _reading(3, (remote,))
    assert "socket" not in roundtrip(wait_chain(evidence([main], ours))).printed()


def test_proc_net_tables_are_parsed_to_addresses_states_and_paths():
    tcp = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
           "timeout inode\n"
           "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
           "        0 1234 1 0000000000000000 100 0 0 10 0\n"
           "   1: 0100007F:9CA4 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0"
           "        0 5678 1 0000000000000000 20 4 30 10 -1\n")
    assert parse_net_inet(tcp) == {1234: ("127.0.0.1:8080", "0.0.0.0:0", "LISTEN"),
                                   5678: ("127.0.0.1:40100", "127.0.0.1:8080", "ESTABLISHED")}
    tcp6 = ("  sl  local_address                         remote_address                        "
            "st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000"
            " 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0 100 0 0 10 0\n")
    assert parse_net_inet(tcp6) == {99: ("[::1]:8080", "[::]:0", "LISTEN")}
    unix = ("Num       RefCount Protocol Flags    Type St Inode Path\n"
            "0000000000000000: 00000002 00000000 00010000 0001 01 4321 /run/app.sock\n"
            "0000000000000000: 00000003 00000000 00000000 0001 03 4322\n")
    assert parse_net_unix(unix) == {4321: "/run/app.sock", 4322: ""}


def test_the_probe_finds_the_process_at_the_other_end_of_a_loopback_connection():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    started = threading.Event()

    def read() -> None:
        started.set()
        client.recv(1)  # blocks until the test sends a byte

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started.wait(10)
    try:
        for _ in range(200):  # until the reader sits in the kernel's read
            waits = read_waits(os.getpid(), depth=0)
            end = waits.socket(client.fileno())
            if end is not None:
                break
            threading.Event().wait(0.05)
        assert end is not None, waits.threads
        assert end.protocol == "tcp" and end.state == "ESTABLISHED"
        assert end.remote == f"127.0.0.1:{listener.getsockname()[1]}"
        assert end.on_this_machine and end.peer_pid == os.getpid()
    finally:
        served.send(b"x")
        reader.join(10)
        for each in (served, client, listener):
            each.close()


def _blocked(pid: int) -> bool:
    """Whether process ``pid`` sleeps in the kernel (it reached its blocking call)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "S"
    except OSError:
        return False


ASK_IN_THREAD = """
import threading
def ask():
    input("overwrite? [y/N] ")
asker = threading.Thread(target=ask, name="asker")
asker.start()
{main}
"""


@pytest.mark.parametrize(("main", "person"), [
    ("asker.join()", True),
    ("lock = threading.Lock(); lock.acquire(); lock.acquire()", False)],
    ids=["main-joins-the-asker", "main-stuck-on-a-lock"])
def test_a_prompt_in_another_thread_waits_for_a_person_only_while_the_main_thread_joins(
        main, person):
    # a prompt asked from a worker thread the main thread joins holds the stall clock; a
    # thread reading the terminal beside a main thread stuck elsewhere does not hide that
    import pty
    import subprocess
    import sys
    import time

    from nsadiag.probes.waits import PersonWait, main_thread_joins, terminal_readers

    master, slave = pty.openpty()
    child = subprocess.Popen([sys.executable, "-c", ASK_IN_THREAD.format(main=main)],
                             stdin=slave, stdout=slave, stderr=subprocess.DEVNULL)
    read_stacks: list[int] = []

    def joins(pid: int) -> bool:
        read_stacks.append(pid)
        return main_thread_joins(pid)

    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and not (terminal_readers(child.pid) and
                                               _blocked(child.pid)):
            time.sleep(0.05)
        readers = terminal_readers(child.pid)
        assert len(readers) == 1 and readers[0] != child.pid  # the asker, not the main thread
        assert not reads_terminal(child.pid)
        now = [0.0]
        waits_for_person = PersonWait(joins, clock=lambda: now[0])
        assert waits_for_person(child.pid) is person
        now[0] = 0.5
        assert waits_for_person(child.pid) is person
        assert read_stacks == [child.pid]  # the main thread's stack read once
        # found elsewhere, it is read again a second later (it may have reached the join
        # since); found joining, not before JOIN_RECHECK_S
        now[0] = 1.5
        assert waits_for_person(child.pid) is person
        assert len(read_stacks) == (1 if person else 2)
    finally:
        child.kill()
        child.wait()
        for fd in (master, slave):
            os.close(fd)


@pytest.mark.parametrize(("waits", "stdout_on_terminal"), [
    ("input('answer? ')", True), ("input('answer? ')", False),
    ("import select; select.select([0], [], [])", False),
    ("import select; p = select.poll(); p.register(0, select.POLLIN); p.poll()", False)],
    ids=["input-on-terminal", "input-stdout-elsewhere", "select", "poll"])
def test_a_process_at_an_input_prompt_reads_the_terminal_and_one_reading_a_pipe_does_not(
        waits, stdout_on_terminal):
    # a prompt reads the terminal, or waits for it in select/poll first (as a line editor
    # does): either way it waits for a person
    import pty
    import subprocess
    import sys
    import time

    master, slave = pty.openpty()
    prompt = subprocess.Popen([sys.executable, "-c", waits], stdin=slave,
                              stdout=slave if stdout_on_terminal else subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    reader, writer = os.pipe()
    piped = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=reader)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and not (reads_terminal(prompt.pid) and
                                               _blocked(piped.pid)):
            time.sleep(0.05)
        assert reads_terminal(prompt.pid)
        assert not reads_terminal(piped.pid)
        assert not reads_terminal(os.getpid())  # this thread runs
    finally:
        for child in (prompt, piped):
            child.kill()
            child.wait()
        for fd in (master, slave, reader, writer):
            os.close(fd)
