"""One answer to "does a prompt wait for a person?" for the whole of `nsadiag run`: the stall
clock (nsadiag.harness.streams) and the live status line (nsadiag.cli.live) ask the same
PersonWait (nsadiag.probes.waits), so that they never disagree about one sample and the
main thread's stack is read once for both."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from nsadiag.cli.live import RunStatus
from nsadiag.harness.session import Tree, watch_session
from nsadiag.harness.streams import UNBOUNDED_STEPS, StallClock, Stream
from nsadiag.harness.times import WatchTimes
from nsadiag.probes.waits import JOIN_RECHECK_S, PersonWait

PID, ASKER = 4242, 4243  # the asking thread is not the main thread: the join decides
WAITING = "waiting for an answer typed at the terminal, no stall check meanwhile"


class _Now:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Prompt:
    """What /proc and py-spy would say: which threads read the terminal, and whether the
    main thread joins (each stack read counted)."""

    def __init__(self, joining: bool):
        self.reading, self.joining, self.stack_reads = [ASKER], joining, 0

    def readers(self, pid: int) -> list[int]:
        return list(self.reading) if pid == PID else []

    def joins(self, pid: int) -> bool:
        self.stack_reads += 1
        return self.joining


def _both(tmp_path: Path, prompt: _Prompt, now: _Now) -> tuple[StallClock, RunStatus]:
    person = PersonWait(prompt.joins, clock=now, readers=prompt.readers)
    status = RunStatus(tmp_path, stall_timeout_s=10, startup_grace_s=0, now=now,
                       awaits_person=person)
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"kind": "start", "pid": PID, "phase": "build", "t": 0})
                      + "\n")
    clock = StallClock([Stream("main", events, UNBOUNDED_STEPS)], stall_timeout_s=10,
                       budget_s=1000, clock=now, startup_grace_s=0,
                       awaits_person=status.awaits_person)
    status.on_events(clock.read())
    return clock, status


def test_the_stall_clock_and_the_status_line_read_one_answer_per_sample(tmp_path):
    prompt, now = _Prompt(joining=True), _Now()
    clock, status = _both(tmp_path, prompt, now)
    for second in range(2, 60, 3):  # the prompt waits well past the stall timeout
        now.now = float(second)
        clock.read()
        assert clock.due() is None, second
        assert WAITING in status.line(), second
    # each asked 20 times; found joining, a stack read stands for JOIN_RECHECK_S, so the
    # two together read it at 2, 14, 26, 38 and 50 s only, as either alone would
    assert JOIN_RECHECK_S == 10.0 and prompt.stack_reads == 5
    prompt.reading = []  # answered; then nothing progresses
    now.now = 75.0
    clock.read()
    assert clock.due() is not None and clock.due().reason == "stall"
    assert "stall timeout: checking" in status.line()


def test_a_terminal_reader_beside_a_main_thread_stuck_elsewhere_is_no_prompt_for_either(
        tmp_path):
    prompt, now = _Prompt(joining=False), _Now()
    clock, status = _both(tmp_path, prompt, now)
    now.now = 12.0
    clock.read()
    line = status.line()
    assert clock.due() is not None and clock.due().reason == "stall"
    assert WAITING not in line and "stall timeout: checking" in line
    assert prompt.stack_reads == 1  # the status line took the clock's reading


def test_two_threads_asking_at_once_share_one_stack_read():
    # the watch's thread and the echo's thread ask at the same moment: the second waits
    # for the first's stack read and takes its answer instead of reading the stack again
    asked = threading.Semaphore(0)
    reads: list[int] = []

    def readers(pid: int) -> list[int]:
        asked.release()
        return [ASKER]

    def joins(pid: int) -> bool:
        reads.append(pid)
        # the other thread has asked too (it now waits for this read) before this ends
        assert asked.acquire(timeout=30) and asked.acquire(timeout=30)
        return True

    person = PersonWait(joins, clock=lambda: 0.0, readers=readers)
    answers: list[bool] = []
    threads = [threading.Thread(target=lambda: answers.append(person(PID)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert answers == [True, True] and reads == [PID]


STUCK = """
import json, os, sys, threading, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": "start", "pid": os.getpid(), "t": time.time()}) + "\\n")
lock = threading.Lock(); lock.acquire(); lock.acquire()
"""


class _OneProcess(Tree):
    def __init__(self, stream: Stream, proc: subprocess.Popen):
        super().__init__([stream])
        self.proc = proc

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_the_watch_asks_the_answer_it_is_given(tmp_path):
    # run_command hands the status line's PersonWait to the watch: the stall clock must
    # ask that one, not one of its own
    events = tmp_path / "events.jsonl"
    events.touch()
    proc = subprocess.Popen([sys.executable, "-c", STUCK, str(events)])
    asked: list[int] = []

    def awaits_person(pid: int) -> bool:
        asked.append(pid)
        return False

    end = watch_session(_OneProcess(Stream("main", events, UNBOUNDED_STEPS), proc),
                        WatchTimes(stall_timeout_s=2.0, startup_grace_s=0.0),
                        awaits_person=awaits_person)
    assert end.reason == "stall" and proc.poll() is not None
    assert asked and set(asked) == {proc.pid}
