"""The findings of measurements without a verdict (nsadiag.finding.measured), from
hand-written measurements: MEASURED with the number a reader looks for first, what stands
out named as the module or process to read, and the next step that follows from it."""

from nsadiag.finding.measured import memory_finding, stacks_finding, trace_finding
from nsadiag.memoryrecord import MemoryRecord
from nsadiag.recordspec import RecordSpec
from nsadiag.traceresult import TraceResult

SPEC = RecordSpec.from_dict({"target": "nsa", "n_layers": 4, "seq_len": 2048})
GIB = 2**30


def memory(standouts: list[str]) -> MemoryRecord:
    return MemoryRecord(saved_total=3 * GIB // 2, peak_rss=6 * GIB, step_s=1.234, device="cpu",
                        layer_standouts=tuple(standouts),
                        saved_by_module={"blocks.0": GIB // 4, "blocks.3": GIB})


def test_a_layer_saving_far_more_than_the_others_is_the_culprit_and_the_next_step():
    found = memory_finding(memory(["blocks.3"]), SPEC)
    assert (found.verdict, found.kind, found.status) == ("MEASURED", "measured", "measured")
    assert found.headline == ("MEASURED (measured): 1.50 GiB saved for backward, peak RSS "
                              "6.00 GiB; blocks.3 stand(s) out")
    assert found.subject == "nsa, 4 layers, S=2048, cpu"
    assert found.culprit.module == "blocks.3"
    assert found.next_action.startswith("Read what blocks.3 keeps for backward")
    assert [(i.mark, i.text) for i in found.results if i.mark == "fail"] == [
        ("fail", "blocks.3 saves more than 4x the median layer")]
    assert ("ok", "most saved by one module: blocks.3 (1.00 GiB)") in \
        [(i.mark, i.text) for i in found.results]
    assert ("ok", "peak RSS: 6.00 GiB; one step 1.2 s") in \
        [(i.mark, i.text) for i in found.results]


def test_memory_with_no_standout_points_at_the_sweeps():
    found = memory_finding(memory([]), SPEC)
    assert found.culprit is None and not found.headline.endswith("stand(s) out")
    assert "`nsadiag sweep-seq`" in found.next_action


def trace(unused: list[str], repeated: list[str]) -> TraceResult:
    return TraceResult.from_dict({
        "unused_parameters": unused, "repeated_gradients": {name: 2 for name in repeated},
        "unfinished_backward": [], "step_s_untraced": 0.5, "step_s_traced": 0.6,
        "overhead_pct": 20.0, "events": 1234, "timeline": [], "trace_json": "trace.json"})


def test_a_gradient_anomaly_names_its_first_module():
    found = trace_finding(trace(["blocks.1.gate.weight"], ["blocks.0.proj.weight"]), SPEC)
    assert found.headline == ("MEASURED (measured): one step 0.50 s, parameters without a "
                              "gradient; gradients accumulated more than once")
    assert found.culprit.module == "blocks.1.gate.weight"
    assert found.next_action == ("Look at blocks.1.gate.weight: parameters without a "
                                 "gradient.")
    assert found.proof == "one step 0.50 s untraced (+20% traced)"
    assert [i.text for i in found.results if i.mark == "fail"] == [
        "parameters without a gradient: blocks.1.gate.weight",
        "gradients accumulated more than once: blocks.0.proj.weight"]


def test_a_clean_trace_points_at_the_timeline():
    found = trace_finding(trace([], []), SPEC)
    assert found.headline.endswith("no gradient anomaly") and found.culprit is None
    assert "ui.perfetto.dev" in found.next_action


def test_the_odd_process_out_is_warned_and_named_as_the_one_to_compare():
    processes = [{"pid": 10, "rank": 0, "state": "in-collective", "signature": "all_reduce"},
                 {"pid": 11, "rank": 1, "state": "busy-python", "signature": "attend"},
                 {"pid": 12, "rank": 2, "state": "in-collective", "signature": "all_reduce"}]
    found = stacks_finding(processes, odd=[11])
    assert found.headline == "MEASURED (measured): busy-python, in-collective (3 process(es))"
    assert [(i.mark, i.text) for i in found.results] == [
        ("ok", "pid 10 (rank 0): in-collective, innermost all_reduce"),
        ("warn", "pid 11 (rank 1): busy-python, innermost attend"),
        ("ok", "pid 12 (rank 2): in-collective, innermost all_reduce")]
    assert found.next_action.startswith("Compare the odd process's stack")
    alike = stacks_finding(processes[:1], odd=[])
    assert "`nsadiag attach PID`" in alike.next_action
