"""The sentences the verdict rules share (nsadiag.verdict.facts), on hand-built evidence:
how the watched process and its limit are named, where its heartbeat stood, its hot frame
(or, beside a sampled profile, only where the kill found it) and the machine's load."""

from nsadiag.evidence import Evidence, ProcessOutcome, StackFrame, StackSample, ThreadStack
from nsadiag.verdict.facts import (
    CHILD,
    add_hot_frame,
    add_load,
    position_facts,
    position_sentence,
    words,
)
from nsadiag.verdict.thresholds import LOADED_PER_CPU


def evidence(spec: dict, events: list[dict], counts: dict[str, int]) -> Evidence:
    return Evidence(spec=spec, events=events, event_counts=counts, result=None,
                    outcome=ProcessOutcome(exit_code=0), stall=None,
                    expected_events_per_step=None, total_steps=2)


def test_a_trial_is_the_child_and_a_users_code_is_named_by_its_subject():
    assert words(evidence({"target": "nsa"}, [], {})) is CHILD
    assert CHILD.who == "the child" and CHILD.limit == "the budget"
    command = words(evidence({"command": ["python", "train.py"]}, [], {}))
    assert (command.who, command.limit, command.users_own) == ("the command", "the deadline",
                                                               True)
    block = words(evidence({"subject": "the watched block"}, [], {}))
    assert block.who == "the watched block" and block.runner == "nsadiag"


def test_the_position_is_the_last_block_event_with_the_steps_finished():
    events = [{"t": 1.0, "kind": "module", "phase": "forward", "step": 1, "module": "blocks.0",
               "edge": "enter", "rss": 10},
              {"t": 2.0, "kind": "module", "phase": "backward", "step": 1,
               "module": "blocks.1", "edge": "exit", "rss": 20},
              {"t": 3.0, "kind": "pulse", "rss": 30}]
    found = evidence({}, events, {"module": 40, "step": 1, "pulse": 3})
    assert position_sentence(position_facts(found)) == (
        "last heartbeat: blocks.1 exit in backward of step 1 (steps finished: 1)")
    silent = evidence({}, [{"t": 1.0, "kind": "start", "phase": "build"}], {"start": 1})
    assert position_sentence(position_facts(silent)) == (
        "no module heartbeat was recorded (1 events in all)")


LOOP = StackFrame("attend", "/home/user/project/model.py", 57, code="for t in range(n):")


def samples(native: bool) -> list[StackSample]:
    below = [StackFrame("at::mm", "libtorch_cpu.so", 0, is_native=True)] if native else []
    return [StackSample(float(i), 5, [ThreadStack(1, "MainThread", [*below, LOOP]),
                                      ThreadStack(2, "idle", [StackFrame(
                                          "wait", "/usr/lib/python3.11/threading.py", 3)],
                                          active=False)], native=native)
            for i in range(3)]


def test_the_hot_frame_is_said_with_its_count_and_what_sits_below_it():
    reasons: list[str] = []
    add_hot_frame(samples(native=True), {}, reasons)
    assert reasons == ["hot frame attend (model.py:57) `for t in range(n):` in 3 of 3 thread "
                       "samples; native frames sit below it"]
    reasons.clear()
    add_hot_frame(samples(native=False), {}, reasons)
    assert reasons[0].endswith("; native frames not sampled")


def test_beside_a_profile_the_samples_only_say_where_the_kill_found_the_run():
    reasons: list[str] = []
    add_hot_frame(samples(native=False), {}, reasons, at_kill=True)
    assert reasons == ["at the kill the stacks were in attend (model.py:57) `for t in "
                       "range(n):` in 3 of 3 thread samples; native frames not sampled"]
    reasons.clear()
    add_hot_frame([], {}, reasons)
    assert reasons == []


def test_the_load_is_said_against_the_usable_cpus():
    per_cpu = 2 * LOADED_PER_CPU
    reading = {"loadavg": [per_cpu * 2, 1.0, 1.0], "cpus": 2}
    reasons: list[str] = []
    found = add_load({"start": reading, "end": reading}, {}, reasons)
    assert found["contended"]
    assert reasons[0].startswith(f"the machine was contended ({per_cpu:.1f} runnable tasks per "
                                 f"usable CPU besides the job's own): load average "
                                 f"{per_cpu * 2:.1f} on 2 usable CPU(s), steal not reported")
    assert reasons[0].endswith("a timing read here must be confirmed on a quieter machine")
    reasons.clear()
    assert add_load(None, {}, reasons) is None and reasons == []
