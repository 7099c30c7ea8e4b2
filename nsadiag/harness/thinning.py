"""Which blocks of a watched model keep their forward pre-hook.

Each hooked block call leaves torch's fast path for module calls (BLOCK_HOOK_CALL_S a
call), so a model of many tiny blocks pays for its hooks at every block call: 4 % of the
step of a model of 64 blocks of about 0.1 ms each. A model of a few heavy blocks pays
nothing it could measure. The block hooks are what names the block running and counts the
progress inside a forward, so they are kept where they are cheap and thinned where they are
not: after the step that found the model, the training thread's CPU time and the block
calls of BLOCK_HOOK_SAMPLE_STEPS steps are read at the optimizer's step (on the training
thread, the only one that may take hooks off: it is the one that iterates them), and when
the hooked calls cost more than BLOCK_HOOK_BUDGET of that time, only every ``stride``-th
block keeps its hook. The always-on cost is then a bounded share of the step, whatever the
block count.

A kept hook then stands for its group (the block and the ``stride - 1`` after it): it adds
the group's size to the block calls, which is exact while the blocks run in order, one
after another, as the repeated blocks of a model do; and the block it names says its
resolution, e.g. ``layers.16 (1 block in 8 watched: layers.16-layers.23)``: the block
running is that one or one of the blocks after it up to the next watched one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nsadiag.verdict.thresholds import BLOCK_HOOK_BUDGET, BLOCK_HOOK_CALL_S, BLOCK_HOOK_SAMPLE_STEPS


def block_stride(calls_per_step: float, step_cpu_s: float, blocks: int,
                 call_s: float = BLOCK_HOOK_CALL_S, budget: float = BLOCK_HOOK_BUDGET) -> int:
    """Watch one block in this many so that the hooked calls cost at most ``budget`` of a
    step's ``step_cpu_s``: 1 (every block) while they do with all hooked, at most
    ``blocks`` (the first block only). Without block calls or CPU time to compare with,
    every block stays watched."""
    if blocks <= 1 or calls_per_step <= 0 or step_cpu_s <= 0:
        return 1
    cost_s, allowed_s = calls_per_step * call_s, budget * step_cpu_s
    if cost_s <= allowed_s:
        return 1
    return min(blocks, math.ceil(cost_s / allowed_s))


@dataclass(frozen=True)
class WatchedBlock:
    """A block that keeps its hook: its index among the blocks, the name the hook gives it
    and the block calls one call of it stands for."""

    index: int
    label: str
    stands_for: int


def watched_blocks(names: list[str], stride: int) -> list[WatchedBlock]:
    """The blocks that keep a hook at ``stride``: every ``stride``-th from the first, each
    named with its resolution (see the module docstring)."""
    if stride <= 1:
        return [WatchedBlock(index, name, 1) for index, name in enumerate(names)]
    kept = []
    for first in range(0, len(names), stride):
        last = min(first + stride, len(names)) - 1
        span = names[first] if last == first else f"{names[first]}-{names[last]}"
        kept.append(WatchedBlock(first, f"{names[first]} (1 block in {stride} watched: {span})",
                                 last - first + 1))
    return kept


class StrideDecision:
    """Reads the step ends after the model was found and gives the stride once (see the
    module docstring): ``step_ended`` returns None until then, and after."""

    def __init__(self, blocks: int, sample_steps: int = BLOCK_HOOK_SAMPLE_STEPS) -> None:
        self.blocks = blocks
        self.sample_steps = sample_steps
        self.steps = -1  # step ends since the first one (the step that found the model)
        self.first: tuple[int, float, int] | None = None  # (calls, CPU s, thread) then
        self.decided = False

    def step_ended(self, calls: int, cpu_s: float, thread: int) -> int | None:
        """A step ended on ``thread`` (its ident) with ``calls`` block calls counted so far
        and ``cpu_s`` CPU seconds used by that thread (``time.thread_time()``)."""
        if self.decided:
            return None
        self.steps += 1
        if self.first is None:
            self.first = (calls, cpu_s, thread)
            return None
        if self.steps < self.sample_steps:
            return None
        self.decided = True
        first_calls, first_cpu_s, first_thread = self.first
        if thread != first_thread:  # steps taken on more than one thread: no CPU time to read
            return 1
        return block_stride((calls - first_calls) / self.steps,
                            (cpu_s - first_cpu_s) / self.steps, self.blocks)
