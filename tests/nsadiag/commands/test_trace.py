import json

import pytest
import torch
from torch import nn

from nsadiag.commands.trace import trace_command
from nsadiag.probes.trace import AutogradTracer
from nsadiag.spec import TrialSpec
from tests.helpers import nsadiag


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)  # never called

    def forward(self, x):
        return self.used(x)


class SharedTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.shared(torch.tanh(self.shared(x)))))


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.mid = nn.Linear(4, 4)
        self.last = nn.Linear(4, 1)

    def forward(self, x):
        return self.last(torch.relu(self.mid(torch.relu(self.first(x)))))


def _backward(model, tracer):
    with tracer:
        model(torch.randn(3, 4, requires_grad=True)).sum().backward()
    return tracer


def test_unused_parameter_is_the_only_one_listed():
    model = WithUnused()
    tracer = _backward(model, AutogradTracer(model))
    assert tracer.unused_parameters() == ["unused.weight", "unused.bias"]
    assert tracer.repeated_gradients() == {}
    assert tracer.unfinished_backward() == []
    assert model.used.weight.grad is not None


def test_linear_used_twice_counts_two_gradients():
    model = SharedTwice()
    tracer = _backward(model, AutogradTracer(model))
    assert tracer.repeated_gradients() == {"shared.weight": 2, "shared.bias": 2}
    assert tracer.unused_parameters() == []
    shared = [e for e in tracer.timeline() if e["module"] == "shared"]
    assert [e["phase"] for e in shared] == ["forward", "forward", "backward", "backward"]
    assert all(e["end_us"] >= e["start_us"] >= 0 for e in tracer.timeline())
    # a single accumulation into .grad per parameter: the count comes from the two calls
    grads = [e for e in tracer.chrome_trace()["traceEvents"] if e["ph"] == "i"]
    assert sorted(e["name"] for e in grads) == sorted(n for n, _ in model.named_parameters())


def test_two_backward_calls_in_one_step_count_twice_per_step():
    model = WithUnused()
    tracer = AutogradTracer(model, modules=["used"])
    with tracer:
        model(torch.randn(2, 4)).sum().backward()
        model(torch.randn(2, 4)).sum().backward()
        tracer.step()
        model(torch.randn(2, 4)).sum().backward()
    assert tracer.repeated_gradients() == {"used.weight": 2, "used.bias": 2}
    assert [e["module"] for e in tracer.timeline()] == ["used"] * 6


def test_raising_backward_hook_leaves_that_module_unfinished():
    model = Chain()

    def explode(module, grad_input, grad_output):
        raise RuntimeError("stall here")

    model.mid.register_full_backward_hook(explode)  # runs before the tracer's hook
    tracer = AutogradTracer(model)
    with pytest.raises(RuntimeError, match="stall here"):
        _backward(model, tracer)
    assert tracer.unfinished_backward() == ["mid"]
    finished = {(e["module"], e["phase"]) for e in tracer.timeline()}
    assert ("last", "backward") in finished
    assert ("first", "backward") not in finished
    assert "first.weight" in tracer.unused_parameters()
    assert "last.weight" not in tracer.unused_parameters()
    stalled = [e for e in tracer.chrome_trace()["traceEvents"]
               if e.get("cat") == "backward-unfinished"]
    assert [e["name"] for e in stalled] == ["mid"]


def test_nsa_trace_command(tmp_path):
    spec = TrialSpec(target="nsa", n_layers=2, seq_len=64,
                     overrides={"dim": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8,
                                "l": 8, "d": 4, "l_sel": 16, "n_sel": 3, "w": 16}, steps=3)
    result = trace_command(spec, tmp_path)  # --steps 3: three traced steps, three untraced
    assert result["unused_parameters"] == []
    assert result["repeated_gradients"] == {}
    assert result["unfinished_backward"] == []
    assert result["events"] > 0
    assert len(result["timeline"]) == 30
    assert result["step_s_traced"] > 0 and result["step_s_untraced"] > 0
    assert len(result["step_s_traced_all"]) == 3 and len(result["step_s_untraced_all"]) == 3

    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "i"}
    # Perfetto names the process and the three threads from the metadata events
    names = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert names[("process_name", 0)] == {"name": "nsadiag trace: nsa"}
    assert {names[("thread_name", tid)]["name"] for tid in (1, 2, 3)} == {
        "module forward", "module backward", "gradient arrivals"}
    assert {e["pid"] for e in events} == {events[0]["pid"]}
    spans = {}
    for e in events:
        if e["ph"] == "X":
            assert {"name", "ts", "dur", "pid", "tid", "cat"} <= e.keys()
            spans.setdefault((e["name"], e["cat"]), []).append(e)
    for block in ("blocks.0", "blocks.1"):
        assert len(spans[(block, "forward")]) == 1
        assert len(spans[(block, "backward")]) == 1
    assert spans[("blocks.0", "forward")][0]["tid"] != spans[("blocks.0", "backward")][0]["tid"]
    assert (spans[("blocks.1", "backward")][0]["ts"]
            < spans[("blocks.0", "backward")][0]["ts"])
    assert (spans[("blocks.0", "forward")][0]["ts"]
            < spans[("blocks.1", "forward")][0]["ts"])
    # backward of a block nests inside the whole backward: it starts after every forward ends
    last_forward_end = max(e["ts"] + e["dur"] for e in events if e.get("cat") == "forward")
    assert spans[("blocks.1", "backward")][0]["ts"] >= last_forward_end - 1e-3
    grads = [e for e in events if e["ph"] == "i"]
    assert len(grads) == sum(1 for _ in _nsa_params(spec))


def _nsa_params(spec):
    from nsadiag.targets import resolve

    return [p for p in resolve(spec).model.parameters() if p.requires_grad]


def test_nsa_timeline_has_blocks_in_order():
    from nsadiag.targets import resolve

    spec = TrialSpec(target="nsa", n_layers=2, seq_len=64,
                     overrides={"dim": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8,
                                "l": 8, "d": 4, "l_sel": 16, "n_sel": 3, "w": 16})
    target = resolve(spec)
    tracer = AutogradTracer(target.model)
    with tracer:
        target.loss(torch.randint(target.vocab_size, (1, 65))).backward()
    rows = {(e["module"], e["phase"]): e for e in tracer.timeline()}
    for block in ("blocks.0", "blocks.1"):
        assert rows[(block, "forward")]["duration_us"] > 0
        assert rows[(block, "backward")]["duration_us"] > 0
    assert rows[("blocks.1", "backward")]["start_us"] < rows[("blocks.0", "backward")]["start_us"]
    assert rows[("blocks.0", "backward")]["end_us"] > rows[("blocks.1", "backward")]["end_us"]
    starts = [e["start_us"] for e in tracer.timeline()]
    assert starts == sorted(starts)


def test_trace_cli_writes_a_perfetto_trace(tmp_path):
    done = nsadiag("trace", "--layers", "1", "--seq-len", "64", "--set", "dim=32", "--set",
                   "n_heads=4", "--set", "n_kv_heads=2", "--set", "head_dim=8", "--set", "l=8",
                   "--set", "d=4", "--set", "l_sel=16", "--set", "n_sel=3", "--set", "w=16",
                   "--out", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["unused_parameters"] == [] and summary["repeated_gradients"] == {}
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# nsadiag trace: ✅ MEASURED (measured): one step") and \
        "## Gradients" in report
    assert summary["command"] == "trace" and summary["status"] == "measured"
    # the command decided the finding and kept it with the result the report renders
    kept = json.loads((tmp_path / "trace-result.json").read_text())["finding"]
    assert kept == json.loads((tmp_path / "summary.json").read_text())["finding"]


def test_profiler_trace_holds_module_and_branch_spans_around_the_operators(tmp_path):
    spec = TrialSpec(target="nsa", n_layers=1, seq_len=64,
                     overrides={"dim": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8,
                                "l": 8, "d": 4, "l_sel": 16, "n_sel": 3, "w": 16})
    result = trace_command(spec, tmp_path, profiler=True)
    assert result["profiler_trace"] == str(tmp_path / "profiler-trace.json")
    events = json.loads((tmp_path / "profiler-trace.json").read_text())["traceEvents"]
    spans = {e["name"]: e for e in events if e.get("ph") == "X"}
    # our ranges: every block and NSA branch, forward and backward
    for name in ("blocks.0 forward", "blocks.0 backward", "blocks.0.attn.sel forward",
                 "blocks.0.attn.cmp forward", "blocks.0.attn.win forward"):
        assert name in spans, name
    # torch's operators in the same trace, inside the block's forward range
    block = spans["blocks.0 forward"]
    inside = [e for e in events if e.get("ph") == "X" and e["name"].startswith("aten::")
              and block["ts"] <= e["ts"] <= block["ts"] + block["dur"]]
    assert any(e["name"] == "aten::linear" or e["name"] == "aten::mm" for e in inside)
