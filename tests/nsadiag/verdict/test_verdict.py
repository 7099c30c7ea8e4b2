"""Verdicts from recorded evidence (tests/fixtures/verdict/*.json, written by hand in the
runner's formats), and the progress and hot-frame helpers on hand-computed cases."""

from __future__ import annotations

import copy
import json

import pytest

from nsadiag.evidence import Evidence, StackFrame, StackSample, StallEvidence, ThreadStack
from nsadiag.harness.streams import Stream
from nsadiag.probes.frames import hot_frame
from nsadiag.verdict import decide
from nsadiag.verdict.progress import is_progress, progress
from nsadiag.verdict.rules import last_progress_t
from nsadiag.verdict.window import judge_window
from tests.helpers import VERDICT_FIXTURES

GiB = 2**30


def raw(name: str) -> dict:
    return json.loads((VERDICT_FIXTURES / name).read_text())


def load(name: str) -> Evidence:
    return Evidence.from_dict(raw(name))


@pytest.mark.parametrize("name", sorted(path.name for path in VERDICT_FIXTURES.glob("*.json")))
def test_evidence_round_trips_through_json(name):
    evidence = load(name)
    again = Evidence.from_dict(json.loads(json.dumps(evidence.to_dict())))
    assert again == evidence
    assert again.to_dict() == raw(name)


# ---- SLOW ---------------------------------------------------------------------------------


def test_budget_kill_while_progressing_is_slow_with_rate_fraction_and_eta():
    # 605 of 21 x 72 = 1512 block entries and exits done at one event per 0.05 s (20/s):
    # fraction 605/1512 = 40.0 %, ETA (1512 - 605) / 20 = 45.35 s.
    verdict = decide(load("slow_budget.json"))
    assert verdict.name == "SLOW"
    facts = verdict.facts
    assert facts.slow.rate == pytest.approx(20.0, abs=0.05)
    assert facts.slow.events_done == 605 and facts.slow.events_expected == 1512
    assert facts.slow.fraction_done == pytest.approx(605 / 1512)
    assert facts.slow.eta_s == pytest.approx(45.35, abs=1.0)
    assert facts.position.since_last_event_s == pytest.approx(0.4, abs=1e-3)
    assert facts.hot.hot_function == "_select_per_token"
    assert facts.hot.hot_frame == "_select_per_token (per_token_loop.py:38)"
    assert facts.hot.hot_count == 3 and facts.hot.native_below is False
    assert facts.position.last_module == "blocks.2.attn.win" and facts.position.last_step == 8
    assert facts.slow.step_s == pytest.approx(3.602)
    assert ("40% done: 605 of 1512 entries and exits of the model's blocks (72 per step x 21 "
            "steps)") in verdict.reasons
    rate = next(r for r in verdict.reasons if "steps/s" in r)
    assert rate.startswith("0.277 steps/s over the last ")  # 19.97/s measured / 72
    assert rate.endswith(" s (20.0 entries and exits of the model's blocks per second, "
                         "72 per step)")
    assert not any("module events" in r for r in verdict.reasons)
    assert "ETA 45 s for the remainder at that pace" in verdict.reasons


def test_budget_kill_within_the_stall_window_is_slow_even_after_a_pause():
    data = raw("slow_budget.json")
    data["outcome"]["ended_at"] = data["events"][-1]["t"] + 9.5  # stall window is 10 s
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW"
    assert verdict.facts.position.since_last_event_s == pytest.approx(9.5, abs=1e-3)


def test_budget_kill_without_a_recorded_end_time_is_slow_because_no_stall_fired():
    data = raw("slow_budget.json")
    data["outcome"]["ended_at"] = None
    data["stall"] = None
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW" and verdict.facts.position.since_last_event_s is None
    assert verdict.facts.slow.eta_s == pytest.approx(45.35, abs=1.0)
    assert verdict.reasons[0].endswith("at an unrecorded time, and the runner's stall watch had "
                                       "not fired")


def test_budget_kill_long_after_the_last_heartbeat_is_not_slow():
    data = raw("slow_budget.json")
    data["outcome"]["ended_at"] = data["events"][-1]["t"] + 25.0
    data["stall"] = None
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "DEADLOCK"
    assert verdict.facts.position.confidence == "low"
    assert verdict.reasons[0] == ("the budget ran out after 32.0 s, but the last progress "
                                  "(heartbeat or sampler pulse) came 25.0 s before the kill "
                                  "(stall window 10.0 s): not progressing")
    assert any("busy cannot be told from idle" in reason for reason in verdict.reasons)


def test_budget_kill_after_heartbeats_stopped_with_busy_cpu_is_stall_busy():
    data = raw("slow_budget.json")
    data["outcome"]["ended_at"] = data["events"][-1]["t"] + 25.0
    data["stall"].update(since_last_event_s=25.0, window_s=25.0, cpu_delta_s=24.6)
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "STALL-BUSY"
    assert verdict.facts.stall.cpu_fraction == pytest.approx(24.6 / 25.0)
    assert verdict.facts.hot.hot_function == "_select_per_token"
    assert verdict.facts.stall.stacks_class == "busy-python"


# ---- stalls -------------------------------------------------------------------------------


def test_idle_frozen_stacks_in_acquire_are_a_deadlock():
    verdict = decide(load("deadlock_lock.json"))
    assert verdict.name == "DEADLOCK"
    facts = verdict.facts
    assert facts.position.confidence == "high"
    assert facts.stall.cpu_fraction == 0.0 and facts.stall.stacks_changed is False
    assert facts.stall.wait_function == "acquire"
    assert facts.stall.wait_frame == "acquire (lock_deadlock.py:31)"
    assert facts.position.last_module == "blocks.0.attn.select"
    assert verdict.reasons[0] == ("no progress for 12.0 s while the process used 0.0 s of CPU "
                                  "in 12.0 s (0%)")
    assert "MainThread is blocked in acquire (lock_deadlock.py:31) `self._inner.acquire()`" \
        in verdict.reasons


def test_idle_without_stacks_is_a_deadlock_with_lower_confidence():
    data = raw("deadlock_lock.json")
    data["stall"]["samples"] = []
    data["stall"]["unavailable"] = ["py-spy: ptrace refused for pid 5120 (Operation not "
                                    "permitted (os error 1))"]
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "DEADLOCK"
    assert verdict.facts.position.confidence == "low"
    assert ("lower confidence: stacks unavailable: py-spy: ptrace refused for pid 5120 "
            "(Operation not permitted (os error 1))") in verdict.reasons


def test_partly_busy_cpu_with_frozen_stacks_is_deadlock_and_with_moving_stacks_busy():
    data = raw("deadlock_lock.json")
    data["stall"]["cpu_delta_s"] = 3.6  # 30 % of the 12 s window
    frozen = decide(Evidence.from_dict(data))
    assert frozen.name == "DEADLOCK" and frozen.facts.position.confidence == "medium"
    assert "CPU partly busy but the stacks are identical across samples: frozen" \
        in frozen.reasons
    moving = copy.deepcopy(data)
    moving["stall"]["samples"][1]["threads"][0]["frames"][0]["line"] = 32
    busy = decide(Evidence.from_dict(moving))
    assert busy.name == "STALL-BUSY" and busy.facts.position.confidence == "medium"
    assert busy.facts.hot.hot_function == "acquire"


def test_busy_native_matmul_is_stall_busy_naming_the_python_frame_above_it():
    verdict = decide(load("busy_matmul.json"))
    assert verdict.name == "STALL-BUSY"
    facts = verdict.facts
    assert facts.stall.cpu_fraction == pytest.approx(0.99)
    assert facts.hot.hot_function == "_dense_scores"
    assert facts.hot.hot_frame == "_dense_scores (dense_mask.py:27)"
    assert facts.hot.hot_count == 3 and facts.hot.native_below is True
    assert facts.stall.stacks_class == "busy-native"
    assert verdict.reasons[0] == ("no progress for 10.0 s while the process used 9.9 s of CPU "
                                  "in 10.0 s (99%)")


def test_rank_waiting_in_all_reduce_is_stall_collective():
    verdict = decide(load("collective_all_reduce.json"))
    assert verdict.name == "STALL-COLLECTIVE"
    assert verdict.facts.stall.collective == "all_reduce"
    assert verdict.facts.stall.collective_frame == "all_reduce (distributed_c10d.py:2806)"
    assert verdict.facts.stall.thread == "MainThread"
    position = verdict.facts.position
    assert position.last_module == "blocks.3" and position.last_step == 2


def test_a_collective_decides_before_cpu_time():
    data = raw("collective_all_reduce.json")
    data["stall"]["cpu_delta_s"] = 29.7  # a busy-polling transport still waits in the collective
    assert decide(Evidence.from_dict(data)).name == "STALL-COLLECTIVE"


def test_a_collective_in_one_sample_of_three_is_passing_through_not_stuck():
    data = raw("collective_all_reduce.json")
    data["stall"]["cpu_delta_s"] = 29.7
    for sample in data["stall"]["samples"][:2]:  # the first two samples are in user code
        sample["threads"][0]["frames"] = sample["threads"][0]["frames"][3:]
        sample["threads"][0]["active"] = True
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "STALL-BUSY"
    assert verdict.facts.hot.hot_frame == "forward (rank_divergent.py:40)"
    assert verdict.facts.hot.hot_count == 2


# ---- OOM, CRASH, ERROR, OK ----------------------------------------------------------------


def test_cuda_out_of_memory_exception_is_oom():
    verdict = decide(load("oom_exception.json"))
    assert verdict.name == "OOM"
    assert verdict.facts.crash.exception_type == "torch.OutOfMemoryError"
    assert verdict.facts.crash.where == "/work/main/repro/dense_mask.py:27 in _dense_scores"
    assert verdict.facts.memory.peak_cuda == 69 * GiB


def test_cpu_allocator_failure_is_oom_even_as_a_runtime_error():
    data = raw("runtime_error.json")
    data["result"]["oom"] = False
    data["result"]["exception"]["message"] = (
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)")
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "OOM" and verdict.facts.crash.exception_type == "RuntimeError"


def test_sigkill_under_a_memory_cap_is_oom():
    verdict = decide(load("sigkill_memory_cap.json"))
    assert verdict.name == "OOM"
    assert verdict.facts.crash.signal_name == "SIGKILL"
    assert verdict.facts.memory.memory_cap_bytes == 8 * GiB
    assert "RSS at the last heartbeat was 7.56 GiB" in verdict.reasons


def test_sigkill_without_a_cap_is_a_crash_unless_the_oom_killer_reported_it():
    data = raw("sigkill_memory_cap.json")
    data["outcome"]["memory_cap_bytes"] = None
    crash = decide(Evidence.from_dict(data))
    assert crash.name == "CRASH" and crash.facts.crash.signal_name == "SIGKILL"
    data["outcome"]["oom_killer"] = True
    assert decide(Evidence.from_dict(data)).name == "OOM"


def test_sigsegv_is_a_crash_naming_the_signal():
    verdict = decide(load("sigsegv.json"))
    assert verdict.name == "CRASH"
    assert verdict.facts.crash.signal == 11 and verdict.facts.crash.signal_name == "SIGSEGV"
    assert verdict.facts.position.last_module == "blocks.1.attn.sel"
    assert verdict.reasons[0].startswith("the child died of SIGSEGV (signal 11) after 6.3 s")


def test_runtime_error_is_error_with_type_message_and_project_frame():
    verdict = decide(load("runtime_error.json"))
    assert verdict.name == "ERROR"
    assert verdict.facts.crash.exception_type == "RuntimeError"
    assert verdict.facts.crash.message.startswith("Trying to backward through the graph a second")
    assert verdict.facts.crash.where == "/work/main/repro/double_backward.py:33 in loss"


def test_ok_result_with_exit_zero_is_ok():
    verdict = decide(load("ok.json"))
    assert verdict.name == "OK"
    assert verdict.facts.to_dict() == {"steps_done": 20, "wall_s": 75.4, "peak_rss": 1_900_000_000}


def test_nonzero_exit_without_exception_or_signal_is_error_with_the_exit_code():
    data = raw("ok.json")
    data["result"] = None
    data["outcome"]["exit_code"] = 137
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "ERROR" and verdict.facts.crash.exit_code == 137
    assert verdict.reasons[0] == "the child exited with code 137 without writing a result"
    assert verdict.reasons[1].startswith("137 = 128 + SIGKILL")


# ---- helpers ------------------------------------------------------------------------------


def _module(t: float, seq: int, step: int, phase: str, module: str = "blocks.0") -> dict:
    return {"t": t, "seq": seq, "kind": "module", "phase": phase, "step": step,
            "module": module, "edge": "enter", "rss": 1, "cuda_alloc": None,
            "cuda_reserved": None}


def test_progress_rate_counts_intervals_inside_the_window():
    events = [_module(float(t), t, 0, "forward") for t in range(11)]  # one per second
    p = progress(events, expected_events_per_step=10, total_steps=4, module_events_done=11,
                 window_s=5.0)
    assert p.rate == pytest.approx(1.0) and p.window_s == pytest.approx(5.0)
    assert p.fraction == pytest.approx(11 / 40)
    assert p.eta_s == pytest.approx(29.0)
    assert p.basis == "module events"
    overrun = progress(events, expected_events_per_step=2, total_steps=4, window_s=5.0)
    assert overrun.fraction == 1.0 and overrun.eta_s == 0.0


def test_progress_without_events_per_step_uses_the_backward_position():
    # Step 0 of 3: 20 forward events, then 10 of about 20 backward events -> 0.75 of a step.
    events = [{"t": 0.0, "seq": 0, "kind": "start", "phase": "build", "step": 0}]
    events += [_module(1.0 + 0.1 * i, 1 + i, 0, "forward") for i in range(20)]
    events += [{"t": 3.0, "seq": 21, "kind": "start", "phase": "backward", "step": 0}]
    events += [_module(3.1 + 0.1 * i, 22 + i, 0, "backward") for i in range(10)]
    p = progress(events, expected_events_per_step=None, total_steps=3)
    assert p.fraction == pytest.approx(0.25)
    assert p.eta_s == pytest.approx(events[-1]["t"] * 3)  # 4.0 s for a quarter: 12 s total
    assert p.events_done == 30 and p.events_expected is None


def test_progress_extrapolates_from_the_process_start_once_the_start_event_scrolled_away():
    # only the last events are kept: step 1 of 4 is half done (in backward), and the
    # build start (t = 0) is no longer among them; the process started at t = -1
    events = [_module(10.0 + i, 100 + i, 1, "forward") for i in range(4)]
    events += [{"t": 14.0, "seq": 104, "kind": "start", "phase": "backward", "step": 1}]
    events += [_module(15.0, 105, 1, "backward")]
    assert progress(events, expected_events_per_step=None, total_steps=4).eta_s is None
    p = progress(events, expected_events_per_step=None, total_steps=4, started_t=-1.0)
    fraction = (1 + 0.5 + 0.5 * 1 / 4) / 4
    assert p.fraction == pytest.approx(fraction)
    assert p.eta_s == pytest.approx(16.0 * (1 - fraction) / fraction)


def test_progress_inside_the_first_forward_has_no_eta():
    events = [{"t": 0.0, "seq": 0, "kind": "start", "phase": "build", "step": 0},
              _module(1.0, 1, 0, "forward"), _module(2.0, 2, 0, "forward")]
    p = progress(events, expected_events_per_step=None, total_steps=5)
    assert p.fraction == 0.0 and p.eta_s is None and p.rate == pytest.approx(1.0)


def test_hot_frame_counts_running_threads_and_reports_the_common_line():
    def sample(line: int) -> StackSample:
        busy = ThreadStack(1, "MainThread", [StackFrame("step", "/m/loop.py", line),
                                             StackFrame("<module>", "/m/loop.py", 3)])
        idle = ThreadStack(2, "Thread-1", [StackFrame("wait", "/usr/lib/threading.py", 327)],
                           active=False)
        return StackSample(t=float(line), pid=9, threads=[busy, idle])

    frame, count, native_below = hot_frame([sample(10), sample(11), sample(10)])
    assert (frame.function, frame.line, count, native_below) == ("step", 10, 3, False)
    assert hot_frame([]) is None


def test_with_no_thread_seen_running_a_thread_blocked_in_a_wait_is_not_the_hot_frame():
    # a loaded machine: py-spy saw no thread running; the main thread spins through two
    # functions while a helper thread sleeps in the same wait in every sample
    def sample(function: str) -> StackSample:
        spin = ThreadStack(1, "MainThread", [StackFrame(function, "/m/spin.py", 20)],
                           active=False)
        helper = ThreadStack(2, "sampler", [StackFrame("Condition.wait",
                                                       "/usr/lib/threading.py", 331)],
                             active=False)
        return StackSample(t=1.0, pid=9, threads=[spin, helper])

    frame, count, _ = hot_frame([sample("_ready"), sample("forward"), sample("_ready")])
    assert (frame.function, count) == ("_ready", 2)
    # when every thread waits, the waits are all there is to report
    waiting = StackSample(t=1.0, pid=9, threads=[ThreadStack(
        1, "MainThread", [StackFrame("acquire", "/m/lock.py", 5)], active=False)])
    assert hot_frame([waiting])[0].function == "acquire"


# ---- progress below module granularity, load and contention -------------------------------


def _pulse(t: float, progress: bool, frame: str = "attend (model.py:42)") -> dict:
    return {"t": t, "kind": "pulse", "progress": progress, "idle_s": 0.0, "frame": frame,
            "cpu_s": 1.0, "runq_s": 0.0, "calls": 10, "nodes": 0, "op": None, "samples": 5}


def test_a_budget_kill_inside_one_long_module_is_slow_when_pulses_show_progress():
    # the last module event came 25 s before the kill (past the 10 s stall window), but
    # the sampler saw a loop iterating until 0.5 s before it: progressing, so SLOW
    data = raw("slow_budget.json")
    last_event = data["events"][-1]["t"]
    data["outcome"]["ended_at"] = last_event + 25.0
    data["pulses"] = [_pulse(last_event + dt, True) for dt in range(1, 25)]
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW"
    assert verdict.facts.position.since_last_event_s == pytest.approx(1.0, abs=1e-3)
    assert "the last progress (heartbeat or sampler pulse) came 1.0 s before the kill" \
        in verdict.reasons[0]


def test_pulses_without_progress_do_not_count_as_progress():
    data = raw("slow_budget.json")
    last_event = data["events"][-1]["t"]
    data["outcome"]["ended_at"] = last_event + 25.0
    data["pulses"] = [_pulse(last_event + dt, False) for dt in range(1, 25)]
    data["stall"].update(since_last_event_s=25.0, window_s=25.0, cpu_delta_s=24.6)
    assert decide(Evidence.from_dict(data)).name == "STALL-BUSY"


def test_progress_is_one_definition_that_the_watcher_the_rules_and_a_window_share(tmp_path):
    # every kind the heartbeat writes, a pulse with and one without progress, and a kind it
    # does not write: the rules once took any event's time as progress (8.0 here), while
    # the watcher's stall clock and an attach window counted only these kinds and pulses
    cases = [({"t": 1.0, "kind": "start", "phase": "forward", "step": 0}, True),
             ({"t": 2.0, "kind": "module", "module": "blocks.0", "edge": "enter",
               "phase": "forward", "step": 0}, True),
             ({"t": 3.0, "kind": "collective", "edge": "start", "n": 1, "op": "all_reduce",
               "phase": "backward", "step": 0}, True),
             ({"t": 4.0, "kind": "step", "phase": "optimizer", "step": 0, "step_s": 3.0},
              True),
             (_pulse(5.0, True), True),
             ({"t": 6.0, "kind": "end", "phase": "optimizer", "status": "ok"}, True),
             (_pulse(7.0, False), False),
             ({"t": 8.0, "kind": "note", "phase": "optimizer"}, False)]
    events, expected = [event for event, _ in cases], [progressed for _, progressed in cases]
    assert [is_progress(event) for event in events] == expected
    stream = Stream("child", tmp_path / "events.jsonl", total_steps=5)
    assert [stream.add([event]) for event in events] == expected
    data = raw("slow_budget.json")
    data["events"] = [event for event in events if event["kind"] != "pulse"]
    data["pulses"] = [event for event in events if event["kind"] == "pulse"]
    assert last_progress_t(Evidence.from_dict(data)) == 6.0
    idle = StallEvidence(since_last_event_s=3.0, window_s=3.0, cpu_delta_s=0.0)
    assert judge_window(idle, events, 3.0).facts.position.heartbeat_progress == sum(expected)
    assert judge_window(idle, events[6:], 3.0).name == "DEADLOCK"


def test_a_spin_that_a_loaded_machine_gave_little_cpu_reads_as_busy_by_its_demand():
    # 28 % of a core in a 12 s window: idle-ish by CPU share; but the main thread spent the
    # rest of the window waiting for a core, so it wanted the CPU all the time
    data = raw("deadlock_lock.json")
    moving = data["stall"]["samples"]
    moving[1]["threads"][0]["frames"][0]["line"] = 32
    data["stall"].update(cpu_delta_s=3.4, main_cpu_delta_s=3.4, runq_delta_s=8.4)
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "STALL-BUSY" and verdict.facts.position.confidence == "high"
    assert verdict.facts.stall.demand == pytest.approx(11.8 / 12.0)
    assert verdict.reasons[0].endswith("its main thread wanted the CPU 98% of that time "
                                       "(8.4 s of it waiting for a core)")


def test_a_waiting_thread_on_a_loaded_machine_is_still_a_deadlock():
    data = raw("deadlock_lock.json")
    data["stall"].update(main_cpu_delta_s=0.0, runq_delta_s=0.01)
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "DEADLOCK" and verdict.facts.position.confidence == "high"


def test_a_waiting_thread_woken_into_a_busy_run_queue_is_still_a_deadlock():
    # seen under load: the DataLoader's main thread, woken from its poll, waited 0.97 s
    # for a core and then ran 0.15 ms: a demand of 44 % that is no work at all
    data = raw("deadlock_lock.json")
    window = data["stall"]["window_s"]
    data["stall"].update(cpu_delta_s=0.01, main_cpu_delta_s=0.00015,
                         runq_delta_s=0.44 * window)
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "DEADLOCK", verdict.reasons
    assert verdict.facts.stall.demand == pytest.approx(0.44, abs=0.01)


def test_a_stall_declared_on_a_contended_machine_is_inconclusive_with_the_figures():
    data = raw("busy_matmul.json")
    data["stall"].update(stretched=True, opportunity_s=4.2)
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "INCONCLUSIVE"
    position = verdict.facts.position
    assert position.would_be == "STALL-BUSY" and position.contended is True
    assert verdict.reasons[-1].startswith("the machine was contended: in 10.0 s without "
                                          "progress the job had 4.2 s of CPU opportunity")


def test_a_slow_verdict_names_the_loop_and_line_of_the_sampled_profile():
    data = raw("slow_budget.json")
    data["profile"] = {
        "samples": 240, "duration_s": 30.0, "phases": {"forward": 200, "backward": 40},
        "hot_lines": [{"where": "attend (model.py:42)", "file": "/home/u/model.py",
                       "line": 42, "code": "o[:, t] = softmax(q[:, t] @ k[:, :t + 1].T) @ v",
                       "count": 180, "fraction": 0.75}],
        "loops": [{"where": "attend (model.py:40)", "variable": "t", "advanced": 812,
                   "restarts": 0, "last": 812, "rate_per_s": 8.1, "observations": 230}],
        "backward_ops": []}
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW"
    assert verdict.facts.hot.hot_line == "attend (model.py:42)"
    # the profile's 240 samples name the hot frame and its share; the three stack samples
    # taken at the kill only say where the run was then
    assert verdict.facts.hot.hot_frame == "attend (model.py:42)"
    assert verdict.facts.hot.hot_share == 0.75 and verdict.facts.hot.hot_source == "profile"
    assert verdict.facts.hot.kill_frame == "_select_per_token (per_token_loop.py:38)"
    assert any(r.startswith("at the kill the stacks were in _select_per_token "
                            "(per_token_loop.py:38)") for r in verdict.reasons)
    assert verdict.facts.hot.loop["variable"] == "t"
    assert "sampled profile: 240 stacks over 30 s (forward 83%, backward 17%)" \
        in verdict.reasons
    assert ("hottest line of user code: attend (model.py:42) "
            "`o[:, t] = softmax(q[:, t] @ k[:, :t + 1].T) @ v` in 75% of the samples") \
        in verdict.reasons
    assert ("loop variable `t` in attend (model.py:40) advanced 812 at 8.1/s: a loop "
            "iterating") in verdict.reasons


def test_the_hot_frame_skips_the_work_counts_dispatch_mode_and_its_plumbing():
    site = "/usr/lib/python3.11/site-packages/torch"
    frames = [StackFrame("OpOverload.__call__", f"{site}/_ops.py", 875),
              StackFrame("__torch_dispatch__", f"{site}/utils/flop_counter.py", 10),
              StackFrame("_fn", f"{site}/_dynamo/eval_frame.py", 1446),
              StackFrame("OpCounter.__torch_dispatch__", "/x/nsadiag/probes/efficiency.py", 5),
              StackFrame("_fn", f"{site}/_dynamo/eval_frame.py", 1446),
              StackFrame("inner", f"{site}/_compile.py", 53),
              StackFrame("GrindingBlock.forward", "/home/u/model.py", 24),
              StackFrame("_call_impl", f"{site}/nn/modules/module.py", 1700)]
    sample = StackSample(t=0.0, pid=1, threads=[ThreadStack(1, "MainThread", frames)])
    frame, count, _ = hot_frame([sample, sample])
    assert (frame.function, count) == ("GrindingBlock.forward", 2)


def test_a_run_cut_off_in_its_first_backward_is_still_told_slow_by_defect():
    # no step finished, but step 0's backward start carries the counted forward
    data = raw("slow_budget.json")
    data["events"] = [e for e in data["events"] if e["kind"] != "step"]
    last = data["events"][-1]
    data["events"].append({**last, "seq": last["seq"] + 1, "kind": "start",
                           "phase": "backward", "module": None, "edge": None,
                           "host_reads_per_step": 4096, "flops_per_op": 2000.0,
                           "dense_flops_per_op": 500000.0, "flops_per_step": 10**9,
                           "efficiency": None, "dense_efficiency": 0.5,
                           "machine_flops_per_s": 2e11})
    data["spec"]["seq_len"] = 4096
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW" and verdict.facts.slow.slow_by == "defect"
    assert any(r.startswith("slow by defect: 4096 host reads") for r in verdict.reasons)


def test_a_budget_kill_after_a_quiet_gap_the_machine_explains_is_slow():
    # 25 s since the last progress, but the watcher measured only 3 s of CPU opportunity
    # in them (the rest waiting for a core): a loaded machine, not a stop
    data = raw("slow_budget.json")
    data["outcome"]["ended_at"] = data["events"][-1]["t"] + 25.0
    data["stall"].update(since_last_event_s=25.0, opportunity_s=3.0)
    assert decide(Evidence.from_dict(data)).name == "SLOW"
    data["stall"]["opportunity_s"] = 20.0
    assert decide(Evidence.from_dict(data)).name != "SLOW"


def test_an_exception_reraised_from_a_dataloader_worker_says_the_original_message():
    data = raw("runtime_error.json")
    data["result"]["exception"] = {
        "type": "KeyError",
        "message": "Caught KeyError in DataLoader worker process 1.\n"
                   "Original Traceback (most recent call last):\n"
                   '  File "/venv/torch/utils/data/_utils/worker.py", line 374, in _worker_loop\n'
                   "    data = fetcher.fetch(index)\n"
                   '  File "/home/u/data.py", line 9, in __getitem__\n'
                   "    raise KeyError(f\"record {i} has no 'label'\")\n"
                   "KeyError: \"record 37 has no 'label'\"",
        "traceback": data["result"]["exception"]["traceback"]}
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "ERROR"
    said = "\"record 37 has no 'label'\" (raised in DataLoader worker process 1)"
    assert verdict.facts.crash.message == said
    assert verdict.reasons[0].endswith(f"raised KeyError: {said}")
