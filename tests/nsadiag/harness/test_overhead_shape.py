"""The watched process's observer costs O(blocks) a step, not O(module calls): once the
model is found no global module hook is left, each block has one pre-hook, block events
are aggregated (a handful a step, standing together for every block entered), and a short
backward's autograd graph is not walked. Counted, not timed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.modules import module as module_mod

from nsadiag.harness import watched
from nsadiag.probes import counters as counters_mod
from nsadiag.probes.sampler import INTERVAL_S
from tests.nsadiag.harness.small_blocks import SmallBlock, wait_until

BLOCKS, STEPS = 48, 12




def test_a_model_of_many_small_modules_costs_blocks_not_module_calls(tmp_path: Path,
                                                                      monkeypatch):
    walks: list[int] = []
    original_walk = counters_mod.graph_nodes

    def counted_walk(tensors):
        walks.append(1)
        return original_walk(tensors)

    monkeypatch.setattr(counters_mod, "graph_nodes", counted_walk)
    # every backward here counts as short, however loaded the machine (a long one is
    # instrumented from the next on, by design)
    monkeypatch.setattr(counters_mod, "LONG_BACKWARD_S", float("inf"))
    torch.manual_seed(0)
    model = nn.Sequential(*[SmallBlock(8) for _ in range(BLOCKS)], nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    global_hooks = len(module_mod._global_forward_pre_hooks)
    heartbeat = watched.ProcessHeartbeat(tmp_path)
    started = time.monotonic()
    heartbeat.start()
    try:
        assert wait_until(lambda: heartbeat.finder is not None)  # torch is in use: hooks go in
        assert len(module_mod._global_forward_pre_hooks) == global_hooks + 1
        for _ in range(STEPS):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        # the model was found at its first call: the global hook is gone, and every
        # block watched has one pre-hook and no other hook of ours (one block in
        # ``block_stride`` once hooks on every block cost too much of this step:
        # nsadiag.harness.thinning, tests/nsadiag/harness/test_block_thinning.py)
        assert heartbeat.root is model and heartbeat.finder is None
        assert len(module_mod._global_forward_pre_hooks) == global_hooks
        assert len(module_mod._global_forward_hooks) == 0
        blocks = list(model)[:BLOCKS]
        stride = heartbeat.block_stride
        assert [len(block._forward_pre_hooks) for block in blocks] == \
            [1 if index % stride == 0 else 0 for index in range(BLOCKS)]
        assert all(len(block._forward_hooks) == 0 for block in blocks)
        assert all(len(inner._forward_pre_hooks) == 0 for block in blocks
                   for inner in block.children())
        hooked = heartbeat.writer.watched_blocks  # the Sequential's children: 48 + the head
        assert hooked == BLOCKS + 1
        # a watched block's call stands for its group's: every block call is counted
        assert heartbeat.counters.calls == hooked * STEPS
    finally:
        heartbeat.stop(remove=True)
    elapsed_s = time.monotonic() - started
    assert len(module_mod._global_forward_pre_hooks) == global_hooks
    assert all(len(block._forward_pre_hooks) == 0 for block in list(model)[:BLOCKS])
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    modules = [event for event in events if event["kind"] == "module"]
    # at most one event per sample and one at each phase boundary (forward, backward,
    # step), whatever the module count, standing together for every block entered
    assert len(modules) <= 3 * STEPS + elapsed_s / INTERVAL_S + 1
    assert sum(event["edges"] for event in modules) == hooked * STEPS
    assert sum(event["kind"] == "step" for event in events) == STEPS
    assert len(walks) == 1  # the first backward only, not every tenth as before


class Waiting(nn.Module):
    """A block that, when ``until`` is set, waits inside its forward until it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.until = None
        self.held: bool | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.until is not None:
            self.held = wait_until(self.until)
        return self.linear(x)


def test_block_counts_reach_the_heartbeat_while_the_forward_runs(tmp_path: Path):
    """The block hooks only count: the sampler's thread writes what they counted while the
    model is still inside its forward, before any phase edge, so a long forward shows
    progress; the phase edge after it writes the rest."""
    model = nn.Sequential(*[Waiting() for _ in range(4)])
    heartbeat = watched.ProcessHeartbeat(tmp_path)
    heartbeat.start()
    try:
        assert wait_until(lambda: heartbeat.finder is not None)
        model[2].until = lambda: heartbeat.writer.module_events > 0
        model(torch.randn(2, 4)).sum().backward()
        assert model[2].held  # a module event was written while block 2 ran
    finally:
        heartbeat.stop(remove=True)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    modules = [event for event in events if event["kind"] == "module"]
    backward = next(event for event in events if event["kind"] == "start" and
                    event["phase"] == "backward")
    # written mid-forward: blocks 0, 1 and 2 entered, block 2 the one running
    assert (modules[0]["edges"], modules[0]["module"], modules[0]["phase"]) == (3, "2", "forward")
    assert modules[0]["seq"] < backward["seq"]
    # the backward's start wrote the last block's enter, before its own event
    assert (modules[1]["edges"], modules[1]["module"]) == (1, "3")
    assert modules[1]["seq"] < backward["seq"]
    assert sum(event["edges"] for event in modules) == 4
