"""The blocks of a watched model keep their pre-hooks while those are cheap against the
step, and one block in so many keeps its hook when they are not
(nsadiag.harness.thinning): the decision from counts, and a watched model of many small
blocks against one of a few heavy blocks. Counted, not timed: the CPU time a step takes
decides, and the two models stand far on either side of the budget."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from nsadiag.harness import watched
from nsadiag.harness.thinning import StrideDecision, block_stride, watched_blocks
from nsadiag.verdict.thresholds import BLOCK_HOOK_SAMPLE_STEPS
from tests.nsadiag.harness.small_blocks import SmallBlock, wait_until


def test_hooks_that_cost_at_most_the_budget_stay_on_every_block():
    step_s = 0.1  # 64 hooked calls a step cost far less than 1 % of 0.1 s
    assert block_stride(64, step_s, 64, call_s=5e-6, budget=0.01) == 1
    # at exactly the budget: still every block
    assert block_stride(100, 0.05, 100, call_s=5e-6, budget=0.01) == 1


def test_hooks_over_the_budget_are_thinned_to_fit_it():
    # 64 calls x 5 us = 320 us against 1 % of 8 ms = 80 us: one block in 4
    assert block_stride(64, 0.008, 64, call_s=5e-6, budget=0.01) == 4
    # a hair over the budget: one block in 2
    assert block_stride(64, 0.0319, 64, call_s=5e-6, budget=0.01) == 2
    # far over: never fewer than one block watched
    assert block_stride(64, 1e-5, 64, call_s=5e-6, budget=0.01) == 64


def test_nothing_to_compare_keeps_every_block():
    assert block_stride(0, 0.008, 64) == 1  # a compiled model: its hooks never run eagerly
    assert block_stride(64, 0.0, 64) == 1
    assert block_stride(64, 1e-6, 1) == 1  # one block: nothing to thin


def test_a_kept_block_names_its_resolution_and_stands_for_its_group():
    names = [f"layers.{i}" for i in range(7)]
    assert [(w.index, w.label, w.stands_for) for w in watched_blocks(names, 1)] == \
        [(i, name, 1) for i, name in enumerate(names)]
    kept = watched_blocks(names, 3)
    assert [(w.index, w.label, w.stands_for) for w in kept] == [
        (0, "layers.0 (1 block in 3 watched: layers.0-layers.2)", 3),
        (3, "layers.3 (1 block in 3 watched: layers.3-layers.5)", 3),
        (6, "layers.6 (1 block in 3 watched: layers.6)", 1)]
    assert sum(w.stands_for for w in kept) == len(names)


def test_the_decision_reads_the_steps_after_the_first_and_is_taken_once():
    decision = StrideDecision(blocks=64, sample_steps=4)
    # the step that found the model: not read (hooking, a compile)
    assert decision.step_ended(64, 5.0, thread=1) is None
    for step in range(1, 4):
        assert decision.step_ended(64 * (step + 1), 5.0 + 0.008 * step, thread=1) is None
    assert decision.step_ended(64 * 5, 5.0 + 0.008 * 4, thread=1) == \
        block_stride(64, 0.008, 64)
    assert decision.step_ended(64 * 6, 5.0 + 0.008 * 5, thread=1) is None  # decided


def test_steps_on_another_thread_keep_every_block():
    decision = StrideDecision(blocks=64, sample_steps=2)
    decision.step_ended(64, 1.0, thread=1)
    decision.step_ended(128, 0.0001, thread=1)
    assert decision.step_ended(192, 0.0002, thread=2) == 1




def _train_watched(tmp_path: Path, model: nn.Module, x: torch.Tensor, steps: int
                   ) -> tuple[watched.ProcessHeartbeat, list[dict], list[int]]:
    """Train ``model`` under the in-process observer; its heartbeat (stopped), its events,
    and the pre-hook count of each block while it was watched."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    heartbeat = watched.ProcessHeartbeat(tmp_path)
    heartbeat.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the training thread does the step's work: its CPU time is read
    try:
        assert wait_until(lambda: heartbeat.finder is not None)  # torch is in use: hooks go in
        for _ in range(steps):
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        hooks = [len(block._forward_pre_hooks) for _, block in heartbeat.blocks]
        copied = copy.deepcopy(model)  # a copy is the model as it is without nsadiag
        assert all(not module._forward_pre_hooks for module in copied.modules())
    finally:
        torch.set_num_threads(threads)
        heartbeat.stop(remove=True)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    return heartbeat, events, hooks


def test_a_model_of_many_small_blocks_ends_with_fewer_hooks(tmp_path: Path):
    """64 blocks of about 0.1 ms each: every hook costs BLOCK_HOOK_CALL_S, the 64 together
    several times the budget of a step that takes a few milliseconds of CPU."""
    blocks, steps = 64, BLOCK_HOOK_SAMPLE_STEPS + 4
    torch.manual_seed(0)
    model = nn.Sequential(*[SmallBlock(16) for _ in range(blocks)])
    heartbeat, events, hooks = _train_watched(tmp_path, model, torch.randn(8, 16), steps)
    stride = heartbeat.block_stride
    assert stride > 1
    assert hooks == [1 if index % stride == 0 else 0 for index in range(blocks)]
    # the kept hooks stand for their groups: every block call is still counted
    assert heartbeat.counters.calls == blocks * steps
    modules = [event for event in events if event["kind"] == "module"]
    assert sum(event["edges"] for event in modules) == blocks * steps
    # the block named says how finely it was watched
    last = modules[-1]["module"]
    first = (blocks - 1) // stride * stride
    span = str(first) if first == blocks - 1 else f"{first}-{blocks - 1}"
    assert last == f"{first} (1 block in {stride} watched: {span})"


def test_a_model_of_few_heavy_blocks_keeps_every_hook(tmp_path: Path):
    """4 blocks of a 384-wide matmul on 384 rows: a step takes tens of milliseconds of CPU
    (over a gigaflop), its 4 hooked calls (BLOCK_HOOK_CALL_S each) a fraction of
    BLOCK_HOOK_BUDGET of it."""
    blocks, steps, width = 4, BLOCK_HOOK_SAMPLE_STEPS + 2, 384
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(blocks)])
    heartbeat, events, hooks = _train_watched(tmp_path, model, torch.randn(width, width), steps)
    assert heartbeat.block_stride == 1 and heartbeat.thinning is None  # decided: every block
    assert hooks == [1] * blocks
    modules = [event for event in events if event["kind"] == "module"]
    assert {event["module"] for event in modules} <= {str(i) for i in range(blocks)}
    assert heartbeat.counters.calls == blocks * steps
