"""Verdicts at the edges of a run, piece by piece: a step that never finishes while a loop
inside it moves, contention that cannot explain the slowness, nsadiag's own threads, a
rank's fatal-error dump, exceptions of other threads, memory that grows, and sentences
that must not contradict themselves (a rate over no time, an ETA-dependent advice without
an ETA, a hottest line that never ran, a profile blind to a GIL held in backward)."""

from __future__ import annotations

import ast
import copy
import json
import math
import threading
import time

import pytest

from nsadiag.evidence import Evidence, StackFrame, StackSample, StallEvidence, ThreadStack
from nsadiag.finding.trial import next_action
from nsadiag.harness import crash, thread_exceptions
from nsadiag.probes import frames
from nsadiag.probes.loops import find_for
from nsadiag.probes.profile import describe, summarize
from nsadiag.probes.sampler import MemoryLedger, Sampler
from nsadiag.verdict.load import contention, contention_sentence, stretch_limit
from nsadiag.verdict.progress import progress
from nsadiag.verdict.rules import decide
from tests.helpers import VERDICT_FIXTURES
from tests.procs import wait_for

SOURCE = '''
def _forward_prefill_sequential(self, q, k, v):
    S = q.shape[1]
    out = []
    for t in range(S):
        out.append(self._attend(q[:, t], k, v, t))
    for j in range(0, S, 64):
        pass
    return out
'''


def _slow_budget() -> dict:
    return json.loads((VERDICT_FIXTURES / "slow_budget.json").read_text())


def _unfinished_forward(last: int, end: int | None, rate: float, got: float) -> dict:
    """A trial cut by its budget in the first forward of one block: no step finished, the
    sampler read `t` of a per-token loop at `last` of `end`, the main thread received
    `got` of the CPU it asked for, and a dense step of this shape takes 1.0 s here."""
    data = _slow_budget()
    t0 = data["outcome"]["ended_at"] - 400.0
    data["spec"].update(seq_len=2048, layers=1)
    data["total_steps"], data["expected_events_per_step"] = 2, None
    data["event_counts"] = {"start": 2, "module": 1}
    data["events"] = [
        {"t": t0, "seq": 0, "kind": "start", "phase": "build", "step": 0, "rss": 1},
        {"t": t0 + 5, "seq": 1, "kind": "start", "phase": "forward", "step": 0, "rss": 1,
         "expected_step_s": 1.0},
        {"t": t0 + 5.1, "seq": 2, "kind": "module", "phase": "forward", "step": 0,
         "module": "blocks.0", "edge": "enter", "rss": 1}]
    data["pulses"] = [{"t": data["outcome"]["ended_at"] - 0.5, "kind": "pulse",
                       "progress": True}]
    data["stall"] = None
    data["load"] = {"start": {"loadavg": [5.8, 5.8, 5.8], "cpus": 2},
                    "end": {"loadavg": [5.8, 5.8, 5.8], "cpus": 2},
                    "main_thread": {"main": {"got": got, "demand": 1.0}}}
    data["profile"] = {
        "samples": 4000, "duration_s": 400.0, "phases": {"build": 50, "forward": 3950},
        "hot_lines": [{"where": "_attend (attention.py:88)", "file": "/u/attention.py",
                       "line": 88, "count": 3000, "fraction": 0.75, "on_cpu": 2900,
                       "phase": "forward", "phase_fraction": 0.76}],
        "loops": [{"where": "_forward_prefill_sequential (attention.py:61)", "variable": "t",
                   "advanced": last, "restarts": 0, "last": last, "rate_per_s": rate,
                   "observations": 900, "by_one": True, "file": "/u/attention.py",
                   "function": "_forward_prefill_sequential", "for_line": 57, "end": end,
                   "phase": "forward", "module": "blocks.0", "pass_rate_per_s": rate,
                   "eta_s": (end - last) / rate if end else None}]}
    return data


# ---- 1. a step that never finishes while a loop inside it moves ----------------------------


def test_a_range_loops_source_line_is_found_and_its_end_expression_kept():
    found = find_for(SOURCE, "_forward_prefill_sequential", "t")
    assert found.line == 5 and isinstance(found.end, ast.Name) and found.end.id == "S"
    assert find_for(SOURCE, "_forward_prefill_sequential", "j").end is not None  # a stride
    assert find_for(SOURCE, "_forward_prefill_sequential", "out") is None
    # not a range: the loop is found, with no end to read from its iterator
    assert find_for("def f(xs):\n    for t in xs:\n        pass\n", "f", "t").end is None


def test_a_forward_that_never_finished_is_slow_by_defect_with_position_and_eta():
    verdict = decide(Evidence.from_dict(_unfinished_forward(1407, 2048, 3.7, got=0.3)))
    assert verdict.name == "SLOW" and verdict.facts.slow.slow_by == "defect"
    reasons = "\n".join(verdict.reasons)
    assert "slow by defect: a per-token loop at /u/attention.py:57" in reasons or \
        "slow by defect: a per-token loop at attention.py:57" in reasons
    assert ("the loop counter: forward of blocks.0 at t = 1,407 of 2,048, 3.7/s: about 3 min "
            "to finish this loop") in reasons
    position = verdict.facts.slow.loop_position
    assert position["last"] == 1407 and position["end"] == 2048
    assert position["eta_s"] == pytest.approx(641 / 3.7)
    # got 30 % of the CPU: contention stretches a run 3.3x at most, the step ran 400x
    assert "contention stretches a run 3.3x at most" in reasons
    assert "contention does not explain the slowness" in reasons
    assert "must be confirmed on a quieter machine" not in reasons
    assert "ETA unknown" not in reasons


def test_contention_is_a_caveat_only_where_the_cpu_share_could_explain_the_slowness():
    found = contention({"start": {"loadavg": [5.8, 5.8, 5.8], "cpus": 2},
                        "end": {"loadavg": [5.8, 5.8, 5.8], "cpus": 2},
                        "main_thread": {"main": {"got": 0.3}}})
    assert stretch_limit(found) == pytest.approx(1 / 0.3)
    slow = contention_sentence(found, {"factor": 400.0, "basis": "it ran 400x"})
    assert slow.endswith("it ran 400x: contention does not explain the slowness")
    close = contention_sentence(found, {"factor": 2.0, "basis": "it ran 2x"})
    assert close.endswith("contention alone could explain it, which a quieter machine must "
                          "confirm")
    # no per-token loop, no count, but a step 400x what its shape takes here: SLOW, and a
    # step only 2x as long on that machine stays INCONCLUSIVE
    data = _unfinished_forward(1407, 2048, 3.7, got=0.3)
    data["profile"]["loops"] = []
    assert decide(Evidence.from_dict(data)).name == "SLOW"
    start = data["events"][1]
    start["expected_step_s"] = 200.0
    assert decide(Evidence.from_dict(data)).name == "INCONCLUSIVE"


def _thread(name: str | None, functions: list[tuple[str, str, int]], active: bool = True,
            thread_id: int = 1) -> ThreadStack:
    return ThreadStack(thread_id=thread_id, name=name, active=active, frames=[
        StackFrame(function=f, file=file, line=line) for f, file, line in functions])


SAMPLER_THREAD = [("int_locals", "/x/nsadiag/probes/sampler.py", 223),
                  ("_sample", "/x/nsadiag/probes/sampler.py", 300),
                  ("run", "/x/nsadiag/probes/sampler.py", 280),
                  ("_bootstrap_inner", "/usr/lib/python3.11/threading.py", 1045),
                  ("_bootstrap", "/usr/lib/python3.11/threading.py", 1002)]


def test_nsadiags_own_threads_are_never_the_users():
    main = _thread("MainThread", [("einsum", "/v/site-packages/torch/functional.py", 372),
                                  ("_attend", "/u/attention.py", 88)], active=False)
    sampler = _thread("nsadiag-sampler", SAMPLER_THREAD, thread_id=2)
    unnamed = _thread(None, SAMPLER_THREAD, thread_id=3)  # as a faulthandler dump shows it
    samples = [StackSample(t=float(i), pid=1, threads=[main, sampler, unnamed])
               for i in range(2)]
    assert frames.nsadiag_thread(sampler) and frames.nsadiag_thread(unnamed)
    assert not frames.nsadiag_thread(main)
    frame, count, _ = frames.hot_frame(samples)
    assert frame.function == "einsum" and count == 2
    # the sampler moving between samples does not make frozen user stacks change
    moved = copy.deepcopy(samples)
    moved[1].threads[1].frames[0].line = 224
    assert not frames.stacks_change(moved)


def test_a_native_sample_beside_a_nonblocking_one_is_compared_by_its_python_frames():
    python = _thread("MainThread", [("wait", "/lib/python3.11/threading.py", 327),
                                    ("main", "/u/train.py", 10)], active=False)
    native = copy.deepcopy(python)
    native.frames.insert(0, StackFrame(function="futex_wait", file="libc.so.6", line=0,
                                       is_native=True))
    samples = [StackSample(t=0.0, pid=1, threads=[python]),
               StackSample(t=1.0, pid=1, threads=[native], native=True)]
    assert not frames.stacks_change(samples)


# ---- 2. the other processes of the tree ---------------------------------------------------


def test_a_dataloader_worker_is_named_by_its_loop_and_its_work_is_inside_the_loop():
    worker = _thread("MainThread", [
        ("TokenDataset.__getitem__", "/u/data.py", 43),
        ("_worker_loop", "/v/site-packages/torch/utils/data/_utils/worker.py", 374),
        ("BaseProcess._bootstrap", "/lib/python3.11/multiprocessing/process.py", 314),
        ("main", "/u/data.py", 59)], active=False)
    worker.frames[0].code = "with self.lock:"
    worker.frames[1].locals = {"worker_id": "1"}
    sample = StackSample(t=0.0, pid=7, threads=[worker])
    from nsadiag.harness.tree import worker_id

    assert worker_id(sample) == 1
    place = frames.describe_place(sample)
    assert place["state"] == "waits" and place["where"] == "TokenDataset.__getitem__ (data.py:43)"
    assert frames.place_sentence(place) == ("waits in TokenDataset.__getitem__ (data.py:43) "
                                            "`with self.lock:`")
    idle = copy.deepcopy(worker)
    idle.frames[0] = StackFrame(function="Queue.get",
                                file="/lib/python3.11/multiprocessing/queues.py", line=103)
    # an idle worker's only own frames are its parent's, below the loop: no work of its own
    assert frames.own_work_frame(idle) is None


# ---- 3. a rank that dies: what it left ----------------------------------------------------


DUMP = """Fatal Python error: Aborted

Thread 0x00007f74fd95c6c0 (most recent call first):
  File "/lib/python3.11/threading.py", line 331 in wait
  File "/x/nsadiag/probes/sampler.py", line 425 in run
  File "/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f74fe85cb80 (most recent call first):
  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/v/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/x/nsadiag/harness/collectives.py", line 171 in counted
  File "/u/train.py", line 17 in debug_stat
  File "/u/train.py", line 40 in main
  File "/u/train.py", line 57 in <module>

Extension modules: torch._C (total: 1)
"""
STDERR = """rank 1 step 2 loss 0.0890
terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 37184 vs 4. \
Received data size doesn't match expected size. Is there a distributed collective mismatch \
in your code?
[rank0]: RuntimeError: Connection reset by peer
E1126 api.py:1002] failed (exitcode: -6) local_rank: 1 (pid: 4242) of binary: python
"""


def test_a_fatal_dump_and_stderr_say_how_and_where_a_rank_died(tmp_path):
    (tmp_path / "faulthandler.txt").write_text("an earlier SIGUSR1 dump\n" + DUMP)
    (tmp_path / "stderr.txt").write_text(STDERR)
    found = crash.read(tmp_path, tmp_path / "stderr.txt", 4242)
    assert found["error"] == "Aborted" and found["signal"] == "SIGABRT"
    # a native thread took the signal: the main thread says what the rank was doing, and
    # nsadiag's collective counter is never named as the user's code
    assert found["thread"] == "main"
    assert found["where"] == "debug_stat (train.py:17)"
    assert found["call"] == "all_reduce (distributed_c10d.py:3252)"
    assert found["stderr"][0] == "terminate called after throwing an instance of " \
                                 "'gloo::EnforceNotMet'"
    assert "Received data size doesn't match expected size" in found["stderr"][1]
    assert not any("Connection reset" in line for line in found["stderr"])
    # no dump, but torchrun logged the rank's signal
    (tmp_path / "faulthandler.txt").write_text("")
    assert crash.read(tmp_path, tmp_path / "stderr.txt", 4242)["signal"] == "SIGABRT"
    assert crash.read(tmp_path, tmp_path / "stderr.txt", 999) is None


# ---- 4. other threads' exceptions, memory that grows --------------------------------------


def test_an_exception_that_ends_a_thread_is_recorded_and_still_printed(tmp_path, capsys):
    path = tmp_path / thread_exceptions.FILE_NAME
    printed = []
    previous = threading.excepthook
    threading.excepthook = printed.append
    try:
        uninstall = thread_exceptions.install(path)

        def parse() -> None:
            int("corrupt")

        worker = threading.Thread(target=parse, name="producer")
        worker.start()
        worker.join()
        uninstall()
        assert threading.excepthook == printed.append
    finally:
        threading.excepthook = previous
    [record] = thread_exceptions.read(path)
    assert record["thread"] == "producer" and record["type"] == "ValueError"
    assert record["message"] == "invalid literal for int() with base 10: 'corrupt'"
    assert record["where"].startswith("parse (test_edges.py:")
    assert len(printed) == 1  # the previous hook still ran


def test_a_stall_verdict_quotes_the_exception_that_ended_another_thread():
    data = json.loads((VERDICT_FIXTURES / "deadlock_lock.json").read_text())
    last = max(event["t"] for event in data["events"])
    data["thread_exceptions"] = [{"t": last - 2.0, "thread": "producer",
                                  "type": "ValueError", "message": "bad record",
                                  "where": "parse (loader.py:30)"}]
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "DEADLOCK"
    # then the wait chain: the fixture's lock, whose holder the scopes (not read in this
    # old record) would tell
    assert verdict.reasons[2].startswith("wait chain: the main thread waits for ")
    assert verdict.reasons[1] == ("an exception ended another thread: thread producer died "
                                  "of ValueError: bad record at parse (loader.py:30), 2.0 s "
                                  "before the last progress (a thread that waits for its "
                                  "work waits forever)")


def test_the_memory_ledger_names_the_frame_that_keeps_what_it_allocates():
    train = (("<module>", "/u/t.py", 40), ("main", "/u/t.py", 29))
    validate = (("<module>", "/u/t.py", 40), ("main", "/u/t.py", 32))
    ledger = MemoryLedger()
    rss = 100
    ledger.observe(rss, train, 0)
    for step in range(10):
        rss += 50  # the training forward takes 50 ...
        ledger.observe(rss, train, step)
        rss -= 50  # ... and backward gives it back
        ledger.observe(rss, train, step)
        rss += 20  # the validation forward keeps 20
        ledger.observe(rss, validate, step)
    from nsadiag.probes.profile import _memory as memory_summary  # noqa: PLC2701

    found = memory_summary(ledger.to_dict())
    assert ledger.to_dict()["held"] == 200
    assert found["holder"]["where"] == "main (t.py:32)"
    assert found["holder"]["held"] == 200 and found["holder"]["steps"] == 10


def test_an_oom_verdict_gives_the_growth_per_step():
    data = json.loads((VERDICT_FIXTURES / "oom_exception.json").read_text())
    t = data["events"][-1]["t"]
    data["events"] += [{"t": t + i, "seq": 900 + i, "kind": "step", "phase": "optimizer",
                        "step": i, "rss": 2**30 + i * 48 * 2**20} for i in range(6)]
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "OOM"
    assert verdict.facts.memory.rss_growth_per_step == pytest.approx(48 * 2**20)
    assert ("resident memory grew 48.0 MiB per step over the last 6 steps (from 1,024.0 MiB "
            "to 1,264.0 MiB at the step ends)") in verdict.reasons


# ---- 5. sentences that must not contradict themselves -------------------------------------


def test_no_rate_is_read_from_a_burst_of_events_over_no_time():
    t0 = 1000.0
    burst = [{"t": t0 + i * 0.0002, "kind": "module", "phase": "forward", "step": 0}
             for i in range(100)]
    p = progress(burst, None, 4, ended_t=t0 + 0.02)
    assert p.rate is None  # 100 events in 0.02 s say nothing about the pace
    later = progress(burst, None, 4, ended_t=t0 + 25.0)
    assert later.rate == pytest.approx(99 / 25.0, rel=1e-3) and later.window_s >= 25.0


def test_a_slow_without_an_eta_advises_nothing_about_an_eta():
    data = _unfinished_forward(1407, None, 3.7, got=0.95)
    data["profile"]["loops"] = []
    data["events"][1].pop("expected_step_s")
    data["load"] = None
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW"
    assert "ETA unknown: no rate or no position to extrapolate from" in verdict.reasons
    advice = next_action(verdict.name, verdict.facts, None)
    assert "ETA" not in advice and "Give the run more time" in advice
    timed = decide(Evidence.from_dict(_slow_budget()))
    assert "more than its ETA (45 s)" in next_action(timed.name, timed.facts, None)


def test_a_line_the_main_thread_waited_on_is_never_the_hottest():
    frames_ = [["<module>", "/u/t.py", 50], ["main", "/u/t.py", 47]]
    profile = {"version": 3, "samples": 100, "first_t": 0.0, "last_t": 10.0, "loops": [],
               "stacks": [{"frames": frames_, "code": None, "phase": "forward",
                           "module": None, "op": None, "count": 100, "on_cpu": 0}]}
    sentences = describe(summarize(profile))
    assert not any(s.startswith("hottest line") for s in sentences)
    assert any(s.startswith("most samples (100%) fell on main (t.py:47)") and
               "off the CPU in 100 of 100: a wait, not work" in s for s in sentences)


def _hold_the_gil(seconds: float) -> None:
    """One C call that holds the GIL for about `seconds` (a big-integer power, sized by a
    first timed call)."""
    exponent = 200_000
    while True:
        started = time.perf_counter()
        pow(3, exponent)
        taken = time.perf_counter() - started
        if taken >= seconds / 4:
            break
        exponent *= 2
    pow(3, int(exponent * (seconds / taken) ** (1 / 1.6)))


def test_seconds_in_which_native_code_held_the_gil_are_counted_by_phase(tmp_path):
    phase = ["forward"]
    sampling, done = threading.Event(), threading.Event()

    def work() -> None:
        # the sampler samples this thread: it holds the GIL once sampled, and stays until
        # a sample after the hold has counted the gap
        sampling.wait(60)
        wait_for(lambda: sampler.book.samples, 60, "the sampler's first sample")
        phase[0] = "backward"
        _hold_the_gil(3.0)
        done.set()
        held = sampler.book.samples
        wait_for(lambda: sampler.book.samples > held, 60, "a sample after the hold")

    worker = threading.Thread(target=work)
    worker.start()
    sampler = Sampler(lambda event: None, tmp_path / "profile.json", interval_s=0.05,
                      main=worker, context=lambda: (phase[0], None))
    sampler.start()
    sampling.set()
    worker.join()
    sampler.stop()
    assert done.is_set()
    profile = json.loads((tmp_path / "profile.json").read_text())
    held = profile["held_off_s"].get("backward", 0.0)
    assert held >= 1.0, profile["held_off_s"]
    [sentence] = [s for s in describe(summarize(profile)) if s.startswith("sampled profile")]
    assert f"the sampler was held off for {held:.1f} s in backward" in sentence
    assert math.isfinite(held)


def test_attach_ends_near_its_duration_however_slow_each_sample_is(monkeypatch):
    from nsadiag.harness import window

    delay = 1.0

    def slow_capture(pid, native=False, timeout_s=10.0, faulthandler_file=None,
                     local_names=False):
        time.sleep(delay)
        main = _thread("MainThread", [("acquire", "/u/t.py", 3)], active=False)
        return StackSample(t=time.time(), pid=pid, threads=[main], cpu_seconds=0.0,
                           native=native)

    monkeypatch.setattr("nsadiag.probes.stacks.capture", slow_capture)
    started = time.monotonic()
    observation = window.sample_window(1, None, 2.0)
    elapsed = time.monotonic() - started
    # six window samples and two native ones took 8 s before; now the window bounds them
    # (the last sample may overrun it by one sample's time)
    assert elapsed < 2.0 + 2 * delay + 1.5, elapsed
    assert isinstance(observation.stall, StallEvidence)
