"""Slow by size or by defect (pure): what one forward dispatched, and what the model's own
loop counters show, read against the thresholds of nsadiag.verdict.thresholds.

A run can be slow because it is big (more work than its limit allows, done at the pace the
machine allows) or because of a defect (a per-token Python loop, a host read per token:
little work in many tiny pieces). The counts come from nsadiag.probes.efficiency (FLOPs,
aten ops, compute ops and host reads of one forward, beside a dense block's), the loop
counters from the sampled profile (nsadiag.probes.profile); both are counts, which the
machine's load cannot change.

- ``slow_by(measured, seq_len)``: "defect" with the findings (a host read per token; ops
  far smaller than a dense block's issued at a compute op or more per token and block),
  else "size";
- ``find_token_loop(profile, seq_len)`` / ``token_loop``: the sampled profile's word for a
  defect when no forward was counted in time (a forward of a per-token loop can outlast a
  limit): a loop counter of the model's code, read in forward or backward, that counted
  over the tokens within one entry of its loop;
- ``far_above_cost(cost)``: whether a step took DEFECT_COST_RATIO times its expected cost
  (nsadiag.probes.efficiency.step_cost) or more: slow for its work, whatever the counts.
"""

from __future__ import annotations

from typing import Any

from nsadiag.probes.loops import function_and_file, loop_location
from nsadiag.verdict.thresholds import (
    COMPUTE_OPS_PER_TOKEN,
    DEFECT_COST_RATIO,
    HOST_READS_PER_TOKEN,
    MIN_HOST_READS,
    RANGE_OVER_POSITIONS,
    TINY_OP_RATIO,
)


def slow_by(measured: dict[str, Any], seq_len: int) -> tuple[str | None, list[str]]:
    """("defect" or "size", the findings that decided it) from one step's measurements
    (the fields of Rates.for_step); (None, []) when no forward's work was counted.

    Slow by defect when either of: a host read per token (``.item()`` in a loop over the
    sequence); ops far smaller than a dense block's (TINY_OP_RATIO) issued at a compute op
    or more per token and watched block (COMPUTE_OPS_PER_TOKEN: a Python loop issuing
    per-token ops; a record without the compute-op count is judged by the ratio alone).
    Otherwise slow by size. Both are counts, which load cannot change; efficiency is a
    timing and only reported (a healthy sparse model at tiny widths runs at a tenth of a
    dense block's efficiency: measured 2.0 % against 22 %)."""
    per_op, dense_per_op = measured.get("flops_per_op"), measured.get("dense_flops_per_op")
    reads = measured.get("host_reads_per_step")
    if reads is None:
        return None, []
    found = []
    if reads >= max(HOST_READS_PER_TOKEN * seq_len, MIN_HOST_READS):
        found.append(f"{reads} host reads (.item(), .tolist()) per step for {seq_len} "
                     f"tokens: a read per token")
    tiny_ops = _tiny_ops(per_op, dense_per_op, measured.get("compute_ops_per_step"),
                         measured.get("blocks"), seq_len)
    if tiny_ops:
        found.append(tiny_ops)
    return ("defect", found) if found else ("size", [])


def _tiny_ops(per_op: float | None, dense_per_op: float | None, compute_ops: int | None,
              blocks: int | None, seq_len: int) -> str | None:
    """The finding of a loop issuing per-token ops, None when the counts do not show one."""
    if not (per_op and dense_per_op and per_op < TINY_OP_RATIO * dense_per_op):
        return None
    sizes = f"{per_op:,.0f} FLOP per op where a dense block's ops average {dense_per_op:,.0f}"
    if compute_ops is None:
        return f"{sizes}: a loop issuing tiny ops"
    blocks = max(int(blocks or 1), 1)
    if compute_ops < max(COMPUTE_OPS_PER_TOKEN * seq_len * blocks, MIN_HOST_READS):
        return None
    return (f"{sizes}, and {compute_ops:,} compute ops (matmuls, attention) in one forward "
            f"for {seq_len} tokens and {blocks} block(s): a loop issuing per-token ops")


def far_above_cost(cost: dict[str, Any] | None) -> bool:
    """Whether a step took DEFECT_COST_RATIO times its expected cost or more."""
    return cost is not None and cost["ratio"] >= DEFECT_COST_RATIO


def find_token_loop(profile: dict[str, Any] | None, seq_len: int) -> dict[str, Any] | None:
    """The loop of the sampled profile (nsadiag.probes.profile.summarize) that is a Python
    loop over the tokens in the model's forward or backward: a loop counter of the user's
    code that steps by one (the source says so: ``range(n)``, ``enumerate``, ``+= 1``;
    ``range(0, S, 64)`` counts chunks, not iterations), read in forward or backward (the
    phase of its last reading; for a profile without it, a function whose lines the
    forward or backward samples were in most), that reached at least HOST_READS_PER_TOKEN x
    seq_len (and MIN_HOST_READS) within one entry of its loop (its last value, or its rises
    over its entries), or whose ``range`` ends within RANGE_OVER_POSITIONS times seq_len (and
    at MIN_HOST_READS or more): a loop over the positions, however far it got. Both are read
    from the program, not timed: load cannot make them up. None otherwise."""
    if not profile or seq_len <= 0:
        return None
    running = {function_and_file(line["where"]) for line in profile.get("hot_lines") or []
               if line.get("phase") in ("forward", "backward")}
    for loop in profile.get("loops") or []:
        if not loop.get("by_one"):
            continue  # a stride other than one makes the value no count of iterations
        phase = loop.get("phase")
        inside = phase in ("forward", "backward") if phase is not None else \
            function_and_file(loop["where"]) in running
        if not inside:
            continue
        reached = max(int(loop.get("last") or 0),
                      int(loop.get("advanced") or 0) // (int(loop.get("restarts") or 0) + 1))
        least = max(HOST_READS_PER_TOKEN * seq_len, MIN_HOST_READS)
        end = loop.get("end")
        over_positions = isinstance(end, int) and least <= end <= RANGE_OVER_POSITIONS * seq_len
        if reached >= least or over_positions:
            return {**loop, "reached": reached}
    return None


def token_loop(profile: dict[str, Any] | None, seq_len: int) -> str | None:
    """The finding of ``find_token_loop`` in words ("a per-token loop at FILE:LINE ..."),
    None when there is none."""
    loop = find_token_loop(profile, seq_len)
    if loop is None:
        return None
    counted = (f"runs to {loop['end']:,} over {seq_len:,} tokens" if loop.get("end") else
               f"counted to {loop['reached']} within one pass over {seq_len} tokens")
    return (f"a per-token loop at {loop_location(loop)} (loop variable `{loop['variable']}` "
            f"in {loop['where']} {counted})")
