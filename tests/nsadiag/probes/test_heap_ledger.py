"""The heap in use names where kept memory was allocated (nsadiag.probes.heap): it moves
when memory is allocated or freed, where resident memory moves where pages are needed."""

from __future__ import annotations

import pytest
import torch

from nsadiag.probes.heap import heap_bytes
from nsadiag.probes.sampler import MemoryLedger
from nsadiag.verdict.rules import _add_memory_growth
from tests.helpers import evidence_of

MIB = 2**20

needs_mallinfo2 = pytest.mark.skipif(heap_bytes() is None, reason="no mallinfo2 in this libc")


@needs_mallinfo2
def test_a_kept_tensor_is_in_the_heap_until_it_is_freed():
    before = heap_bytes()
    kept = torch.empty(4 * MIB // 4, dtype=torch.float32).fill_(1.0)  # 4 MiB
    during = heap_bytes()
    del kept
    after = heap_bytes()
    assert during - before >= 4 * MIB
    assert during - after >= 4 * MIB


@needs_mallinfo2
def test_the_line_that_keeps_a_tensor_each_step_holds_the_heap_ledger():
    # a step: a forward (line 28) whose memory the backward frees, then a validation
    # forward (line 32) whose result is kept; the ledger reads the heap at each call's end
    ledger, kept, outer = MemoryLedger(), [], ("<module>", "train.py", 40)
    ledger.observe(heap_bytes(), (outer,), 0)
    for step in range(4):
        activations = torch.ones(MIB // 2)  # 2 MiB
        ledger.observe(heap_bytes(), (outer, ("main", "train.py", 28)), step)
        del activations
        ledger.observe(heap_bytes(), (outer, ("main", "train.py", 29)), step)
        kept.append(torch.ones(MIB // 4))  # 1 MiB a step, kept
        ledger.observe(heap_bytes(), (outer, ("main", "train.py", 32)), step)
    holders = {tuple(h["frame"]): h for h in ledger.holders()}
    line = holders[("main", "train.py", 32)]
    assert line["held"] >= 4 * MIB and line["steps"] == 4
    assert ("main", "train.py", 28) not in holders or \
        holders[("main", "train.py", 28)]["held"] < MIB


def _holder(where: str, held: int) -> dict:
    return {"where": where, "file": "train.py", "line": 1, "code": None, "held": held,
            "steps": 9}


def test_the_heap_ledgers_holder_is_named_over_the_resident_memorys():
    memory = {"rss": {"holder": _holder("main (train.py:30)", 400 * MIB)},
              "heap": {"holder": _holder("main (train.py:32)", 780 * MIB)}}
    facts: dict = {}
    reasons: list[str] = []
    _add_memory_growth(evidence_of({}, {"profile": {"memory": memory}}), facts, reasons)
    assert facts["rss_holder"] == "main (train.py:32)"
    assert reasons[-1].startswith("the frame that keeps allocating across steps: main "
                                  "(train.py:32) holds 780.0 MiB of heap memory in use")
    # without a heap ledger (a C library without mallinfo2) resident memory names it
    del memory["heap"]
    facts, reasons = {}, []
    _add_memory_growth(evidence_of({}, {"profile": {"memory": memory}}), facts, reasons)
    assert facts["rss_holder"] == "main (train.py:30)"
    assert "400.0 MiB of resident memory" in reasons[-1]
