"""The pieces behind "progress, not module events": the sampler's judge, the work counters
and the watcher's clocks, each on hand-made inputs (no timing thresholds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from nsadiag.harness import streams
from nsadiag.harness.streams import FINISH_GRACE_S, StallClock, Stream
from nsadiag.probes.counters import WorkCounters
from nsadiag.probes.sampler import ProgressJudge
from nsadiag.verdict.thresholds import STALL_STRETCH

# ---- the judge ------------------------------------------------------------------------------


def test_a_new_state_is_progress_and_a_revisited_one_is_not():
    judge = ProgressJudge()
    assert judge.observe((0, 0), ("loop", 1)) is False  # nothing to compare the first with
    assert judge.observe((0, 0), ("loop", 2)) is True  # the loop variable moved
    assert judge.observe((0, 0), ("loop", 3)) is True
    # a spin revisits the states it has been in since the last progress
    assert judge.observe((0, 0), ("loop", 2)) is False
    assert judge.observe((0, 0), ("loop", 3)) is False


def test_a_moving_counter_is_progress_even_in_a_state_seen_before():
    judge = ProgressJudge()
    judge.observe((0, 0), "in backward")
    assert judge.observe((0, 0), "in backward") is False  # one native call, frozen
    assert judge.observe((0, 5), "in backward") is True  # autograd nodes ran
    assert judge.observe((0, 5), "in backward") is False


# ---- the counters ---------------------------------------------------------------------------


class _Probe(torch.autograd.Function):
    """Identity whose backward records what the counters say while it runs."""

    seen: list = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _Probe.seen.append((_Probe.counters.op, _Probe.counters.in_backward))
        return grad


def test_counters_count_module_calls_and_backward_nodes_and_name_the_running_op():
    counters = WorkCounters().install()
    try:
        _Probe.counters, _Probe.seen = counters, []
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        calls = counters.calls
        y = model(_Probe.apply(torch.randn(3, 4, requires_grad=True))).sum()
        assert counters.calls - calls == 4  # the Sequential and its three children
        nodes = counters.nodes
        y.backward()
        assert counters.nodes > nodes
        assert _Probe.seen == [("_ProbeBackward", 1)]
        assert counters.op is None and counters.in_backward == 0  # no stale op afterwards
    finally:
        counters.remove()
    assert not getattr(torch.autograd.backward, "__nsadiag_counted__", False)
    calls = counters.calls
    nn.Linear(2, 2)(torch.randn(1, 2))
    assert counters.calls == calls  # removed: nothing counts any more


def test_an_instrumented_backward_hooks_no_parameter_accumulator():
    """A parameter's AccumulateGrad node outlives the backward (the next step's graph
    reuses it), and torch keeps a removed hook's wrapper on its node: a hook on it would
    cost every later backward. The hooks go on every other node (fewer than MAX_HOOKS
    here), and a tick per hooked node is what ``nodes`` counts."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    loss = model(torch.randn(3, 4)).sum()
    names = []
    stack = [loss.grad_fn]
    while stack:  # the graph's nodes, each once (this one is a tree)
        node = stack.pop()
        names.append(node.name())
        stack.extend(n for n, _ in node.next_functions if n is not None)
    accumulators = names.count("torch::autograd::AccumulateGrad")
    assert accumulators == 4  # two weights, two biases
    counters = WorkCounters().install(count_calls=False)
    try:
        loss.backward()  # the first backward is instrumented
    finally:
        counters.remove()
    assert counters.nodes == len(names) - accumulators


# ---- the watcher ----------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, *events: dict) -> None:
    with open(path, "a") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def _watcher(tmp_path: Path, total_steps: int = 3, budget_s: float = 100.0):
    path = tmp_path / "events.jsonl"
    path.touch()
    clock = _Clock()
    stream = Stream("trial", path, total_steps)
    watcher = StallClock([stream], stall_timeout_s=10.0, budget_s=budget_s, clock=clock,
                      startup_grace_s=0.0)
    return watcher, path, clock


FORWARD = {"t": 0, "kind": "module", "phase": "forward", "step": 0, "module": "blocks.0",
           "edge": "enter"}


def test_progressing_pulses_hold_the_stall_clock_and_idle_ones_do_not(tmp_path):
    watcher, path, clock = _watcher(tmp_path)
    _write(path, FORWARD)
    watcher.read()
    for second in range(1, 30):  # a loop iterating inside one module for 29 s
        clock.now = float(second)
        _write(path, {"t": second, "kind": "pulse", "progress": True})
        watcher.read()
        assert watcher.due() is None
    for second in range(30, 45):  # then the same frame, no counter moving
        clock.now = float(second)
        _write(path, {"t": second, "kind": "pulse", "progress": False})
        watcher.read()
    due = watcher.due()
    assert due is not None and due.reason == "stall"
    assert due.quiet_s == pytest.approx(44.0 - 29.0) and due.stretched is False


def test_run_queue_waits_do_not_count_until_the_stretch_limit(tmp_path, monkeypatch):
    # the main thread spent all but 1 s of every 10 s waiting for a core: no stall at 10 s
    # of quiet, and at STALL_STRETCH windows the stall is declared as contended
    waited = {"s": 0.0}
    monkeypatch.setattr(streams, "run_queue_seconds", lambda pid: waited["s"])
    watcher, path, clock = _watcher(tmp_path)
    _write(path, {**FORWARD, "kind": "start", "pid": 4242, "phase": "build"}, FORWARD)
    watcher.read()
    clock.now, waited["s"] = 11.0, 9.9
    assert watcher.due() is None  # 11 s quiet, 1.1 s of it with the CPU
    clock.now, waited["s"] = 10.0 * STALL_STRETCH + 1.0, 0.95 * (10.0 * STALL_STRETCH + 1.0)
    due = watcher.due()
    assert due is not None and due.reason == "stall" and due.stretched is True
    assert due.opportunity_s < 10.0


def test_the_budget_cuts_a_progressing_run_but_a_finished_one_gets_its_grace(tmp_path):
    watcher, path, clock = _watcher(tmp_path, total_steps=1, budget_s=20.0)
    _write(path, FORWARD)
    watcher.read()
    clock.now = 19.0
    _write(path, {"t": 19, "kind": "pulse", "progress": True})
    watcher.read()
    clock.now = 21.0
    assert watcher.due().reason == "budget"
    _write(path, {"t": 21, "kind": "step", "step": 0, "phase": "optimizer"})
    watcher.read()  # the last step finished: writing result.json is not cut off
    assert watcher.finished and watcher.due() is None
    clock.now = 20.0 + FINISH_GRACE_S + 1.0
    assert watcher.due().reason == "budget"


def test_a_prompt_waiting_at_the_terminal_holds_the_stall_clock(tmp_path):
    # input() at a prompt: the main thread reads the terminal, no progress for minutes;
    # waiting for a person is not a stall, and the clock runs again once the read ends
    asked = {"waiting": True}
    watcher, path, clock = _watcher(tmp_path, budget_s=1000.0)
    watcher.awaits_person = lambda pid: pid == 4242 and asked["waiting"]
    _write(path, {**FORWARD, "kind": "start", "pid": 4242, "phase": "build"}, FORWARD)
    watcher.read()
    for second in range(1, 300, 5):
        clock.now = float(second)
        watcher.read()
        assert watcher.due() is None, second
    asked["waiting"] = False  # answered, then stuck elsewhere
    for second in range(300, 312):
        clock.now = float(second)
        watcher.read()
    due = watcher.due()
    assert due is not None and due.reason == "stall" and due.quiet_s > 10.0
