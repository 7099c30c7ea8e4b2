"""A stalled process classified from hand-built stall evidence (nsadiag.verdict.stall):
a thread in a collective, a busy process with its hot frame, an idle one blocked in a
wait (and the user's line that called it), the CPU between idle and busy read with the
stacks and the main thread's demand, no CPU reading, and a contended machine."""

import pytest

from nsadiag.evidence import StackFrame, StackSample, StallEvidence, ThreadStack
from nsadiag.verdict.stall import busy_fraction, classify_stall, contended, cpu_sentence
from nsadiag.verdict.thresholds import BUSY_AT_ONE_LINE, BUSY_CPU_FRACTION, IDLE_CPU_FRACTION

WINDOW_S = 10.0
TRAIN = "/home/user/project/train.py"
MODEL = "/home/user/project/model.py"
THREADING = "/usr/lib/python3.11/threading.py"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"

LOCK_WAIT = [StackFrame("acquire", TRAIN, 31, code="self._inner.acquire()"),
             StackFrame("forward", MODEL, 71, code="self._record(x)")]
QUEUE_WAIT = [StackFrame("wait", THREADING, 320, code="waiter.acquire()"),
              StackFrame("get", "/usr/lib/python3.11/queue.py", 171, code="self.not_empty.wait()"),
              StackFrame("main", TRAIN, 47, code="batch = batches.get()")]
IN_ALL_REDUCE = [StackFrame("all_reduce", C10D, 2500),
                 StackFrame("train_step", TRAIN, 80, code="dist.all_reduce(loss)")]


def in_loop(line: int) -> list[StackFrame]:
    return [StackFrame("attend", MODEL, line, code="for t in range(n):"),
            StackFrame("forward", MODEL, 90)]


def samples(*stacks: list[StackFrame], name: str | None = "MainThread") -> list[StackSample]:
    """One sample per stack, one second apart, of a single thread."""
    return [StackSample(t=100.0 + i, pid=4242, threads=[ThreadStack(7, name, frames)])
            for i, frames in enumerate(stacks)]


def stall(share: float | None, taken: list[StackSample], **more) -> StallEvidence:
    """A stall of WINDOW_S seconds in which the process used ``share`` of a core (None:
    unreadable)."""
    return StallEvidence(since_last_event_s=WINDOW_S, window_s=WINDOW_S,
                         cpu_delta_s=None if share is None else share * WINDOW_S,
                         samples=taken, **more)


def test_a_thread_in_a_collective_is_a_collective_stall_whatever_its_cpu():
    verdict = classify_stall(stall(1.0, samples(*[IN_ALL_REDUCE] * 3)))
    assert verdict.name == "STALL-COLLECTIVE"
    assert ("MainThread waits in the collective all_reduce (distributed_c10d.py:2500) in 3 "
            "of 3 stack samples") in verdict.reasons


def test_a_busy_process_is_a_busy_stall_named_by_its_hot_frame():
    verdict = classify_stall(stall(BUSY_CPU_FRACTION, samples(in_loop(57), in_loop(57),
                                                               in_loop(58))))
    assert verdict.name == "STALL-BUSY"
    assert ("hot frame attend (model.py:57) `for t in range(n):` in 3 of 3 thread samples; "
            "native frames not sampled") in verdict.reasons
    assert verdict.reasons[0] == (f"no progress for {WINDOW_S:.1f} s while the process used "
                                  f"{BUSY_CPU_FRACTION * WINDOW_S:.1f} s of CPU in "
                                  f"{WINDOW_S:.1f} s ({BUSY_CPU_FRACTION:.0%})")


def test_an_idle_process_frozen_in_a_lock_is_a_deadlock_at_its_wait():
    verdict = classify_stall(stall(0.0, samples(*[LOCK_WAIT] * 3)))
    assert verdict.name == "DEADLOCK"
    assert "stacks identical across all 3 samples" in verdict.reasons
    assert "MainThread is blocked in acquire (train.py:31) `self._inner.acquire()`" \
        in verdict.reasons


def test_a_wait_inside_the_library_names_the_users_line_that_called_it():
    verdict = classify_stall(stall(0.0, samples(*[QUEUE_WAIT] * 2)))
    assert verdict.name == "DEADLOCK"
    assert ("MainThread is blocked in wait (threading.py:320) `waiter.acquire()`, called from "
            "main (train.py:47) `batch = batches.get()`") in verdict.reasons


def test_an_unnamed_thread_is_named_by_its_id():
    verdict = classify_stall(stall(0.0, samples(*[LOCK_WAIT] * 2, name=None)))
    assert "thread 7 is blocked in acquire (train.py:31) `self._inner.acquire()`" \
        in verdict.reasons


def test_idle_with_changing_stacks_is_a_deadlock_said_with_lower_confidence():
    verdict = classify_stall(stall(0.0, samples(LOCK_WAIT, QUEUE_WAIT)))
    assert verdict.name == "DEADLOCK"
    assert ("lower confidence: the stacks change between samples although the CPU is idle "
            "(a polling wait that never ends)") in verdict.reasons


PARTLY = (IDLE_CPU_FRACTION + BUSY_CPU_FRACTION) / 2


def test_partly_busy_with_changing_stacks_is_working():
    assert IDLE_CPU_FRACTION <= PARTLY < BUSY_CPU_FRACTION
    verdict = classify_stall(stall(PARTLY, samples(in_loop(57), in_loop(60), in_loop(63))))
    assert verdict.name == "STALL-BUSY"
    assert "CPU partly busy and the stacks change between samples: working" in verdict.reasons


def test_partly_busy_with_frozen_stacks_is_frozen_unless_the_main_thread_wanted_the_cpu():
    frozen = samples(*[in_loop(57)] * 3)
    verdict = classify_stall(stall(PARTLY, frozen))
    assert verdict.name == "DEADLOCK"
    assert "CPU partly busy but the stacks are identical across samples: frozen" \
        in verdict.reasons
    # the main thread on the CPU or waiting for one for `wanted` of the window, on the CPU for
    # most of it: busy at one line, however little of a core the machine gave it
    wanted = (BUSY_AT_ONE_LINE + BUSY_CPU_FRACTION) / 2
    assert BUSY_AT_ONE_LINE <= wanted < BUSY_CPU_FRACTION and PARTLY < BUSY_CPU_FRACTION
    at_one_line = stall(PARTLY, frozen, main_cpu_delta_s=0.8 * wanted * WINDOW_S,
                        runq_delta_s=0.2 * wanted * WINDOW_S)
    assert busy_fraction(at_one_line) == pytest.approx(max(PARTLY, wanted))
    verdict = classify_stall(at_one_line)
    assert verdict.name == "STALL-BUSY"
    assert any(r.startswith("CPU partly busy and the stacks are identical across samples, but "
                            f"the main thread wanted the CPU {wanted:.0%} of the time: busy at "
                            "one line") for r in verdict.reasons)


def test_a_thread_woken_on_a_busy_machine_is_not_made_busy_by_its_run_queue_wait():
    # wanted the CPU all window, but received almost none of it: the wait says nothing of work
    woken = stall(0.0, samples(*[LOCK_WAIT] * 3), main_cpu_delta_s=0.0,
                  runq_delta_s=WINDOW_S)
    assert busy_fraction(woken) == 0.0
    assert classify_stall(woken).name == "DEADLOCK"
    assert cpu_sentence(woken).endswith(
        f"; its main thread wanted the CPU 100% of that time ({WINDOW_S:.1f} s of it waiting "
        f"for a core)")


def test_without_a_cpu_reading_the_stacks_alone_decide():
    waiting = classify_stall(stall(None, samples(*[LOCK_WAIT] * 2)))
    assert waiting.name == "DEADLOCK"
    assert waiting.reasons[0] == f"no progress for {WINDOW_S:.1f} s; process CPU time unavailable"
    assert "medium confidence: CPU time unavailable; the stacks alone read as waiting" \
        in waiting.reasons
    nothing = classify_stall(stall(None, [], unavailable=["py-spy: ptrace refused"]))
    assert nothing.name == "DEADLOCK"
    assert ("low confidence: neither CPU time nor stacks are available, so busy cannot be told "
            "from idle; stacks unavailable: py-spy: ptrace refused") in nothing.reasons


def test_a_stall_on_a_contended_machine_is_inconclusive_naming_what_the_stacks_say():
    evidence = stall(0.0, samples(*[LOCK_WAIT] * 3), opportunity_s=2.5, stretched=True)
    verdict = contended(evidence, classify_stall(evidence))
    assert verdict.name == "INCONCLUSIVE"
    assert verdict.reasons[-1] == (
        f"the machine was contended: in {WINDOW_S:.1f} s without progress the job had 2.5 s "
        f"of CPU opportunity, less than the stall window; the stacks alone would read as "
        f"DEADLOCK, which a quieter machine must confirm")
