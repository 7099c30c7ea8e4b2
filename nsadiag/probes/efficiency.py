"""How much of this machine's arithmetic a training step uses: slow by size or by defect.

A run can be slow because it is big (more work than the budget allows, done at the pace
the machine allows) or because of a defect (a per-token Python loop, a host sync per
token: little work in many tiny pieces). What one forward dispatches tells the two apart,
and how fast the arithmetic runs is reported beside:

- ``count_work()``: a context counting the FLOPs (``torch.utils.flop_counter``: matmuls,
  convolutions, attention, the CPU's flash attention included), the aten ops and the host
  reads (``.item()``) of what runs inside it;
- ``matmul_rate(device, dtype)``: FLOP/s of a square matmul here, the best of repeats over
  a fraction of a second, measured once per process and again after the dense reference
  (the best reading is kept: a reading taken while another process held a core is low);
- ``dense_reference(...)``: the efficiency (achieved FLOP/s over the matmul rate) of one
  forward and backward of a plain transformer block (SDPA attention and a 4x MLP) of the
  target's batch, sequence length and width: what a healthy model of these dims reaches,
  with the matmul rate it was measured against;
- ``slow_by(measured, seq_len)``: "defect" with the findings (a host read per token; ops
  far smaller than a dense block's issued at a matmul or more per token and block), else
  "size"; efficiency is reported beside;
- ``find_token_loop(profile, seq_len)`` / ``token_loop``: the sampled profile's word for a
  defect when no forward was counted in time (a forward of a per-token loop can outlast a
  budget): a loop counter of the model's code, read in forward or backward, that counted
  over the tokens within one entry of its loop;
- ``step_cost(measured, step_s)``: a step's time against its expected cost, the time the
  dense reference would take here for the step's FLOPs (FLOPs over the dense block's
  achieved FLOP/s, i.e. over this machine's matmul rate times the dense efficiency). The
  matmul rate cancels out of the ratio, so a noisy rate reading does not move it;
  ``far_above_cost`` says whether a step took DEFECT_COST_RATIO times that or more.

torch is imported by the functions that use it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

TINY_OP_RATIO = 0.02
"""Ops averaging below this fraction of a dense block's FLOPs per op are tiny (measured: a
per-token attention loop 0.004; the built-in NSA 0.05-0.065 at S = 256, but 0.012 at
S = 2048 and width 32: a sparse model's ops shrink against dense attention's, whose work
per op grows with S, so the ratio alone cannot name a per-token loop)."""
COMPUTE_OPS_PER_TOKEN = 1.0
"""...and they come from a loop over the tokens when the forward issues at least this many
compute ops (matmuls, convolutions, attention: the ops with a FLOP count) per token and
watched block. Measured per block and forward: a per-token attention loop 2 per token
(4,101 at S = 2048); the built-in NSA 0.04-0.31 (tiny widths, S = 64-4096; 87 at
S = 2048), the tiled CPU backend included."""
HOST_READS_PER_TOKEN = 0.5
"""Host reads per step at or above this many per sequence position are a read per token."""
MIN_HOST_READS = 64
"""...and at least this many: a short sequence's few reads per block are not per token
(the built-in NSA reads 16 per layer at 256 tokens, none at 64)."""
MATMUL_SIZE = 512
TIMED_RUNS = 3
REFERENCE_MAX_TOKENS = 4096
"""The dense reference runs at most this many tokens (batch x sequence): its efficiency
hardly changes beyond, and a long sequence's full attention matrix would not fit."""
RATE_WINDOW_S = 0.15
DEFECT_COST_RATIO = 100.0
"""A step taking this many times the dense reference's time for its FLOPs or more is slow
for its work, whatever the counts say. The ratio is a timing and a noisy one at small
widths (measured on 2 shared cores: the per-token loop 15-250x at S=512 and 24x at S=64
from run to run, the built-in NSA 1.5-6x), so the bar sits where no healthy model came
near it; the counts decide the common defects."""
_RATES: dict[tuple[str, str], float] = {}


@dataclass
class WorkCount:
    """Filled in when the ``count_work`` context exits: FLOPs, aten ops dispatched, the
    compute ops among them (those with a FLOP count: matmuls, convolutions, attention)
    and the host reads (``.item()``, ``.tolist()``: aten._local_scalar_dense)."""

    flops: int | None = None
    ops: int = 0
    compute_ops: int = 0
    host_reads: int = 0

    def flops_per_op(self) -> float | None:
        return self.flops / self.ops if self.flops is not None and self.ops else None


def _count_cpu_attention() -> None:
    """Teach FlopCounterMode the CPU flash-attention ops that scaled_dot_product_attention
    runs on a CPU (torch counts only the CUDA kernels): without them a model whose
    attention is SDPA would look idle in its attention and read as slow by defect."""
    import torch
    from torch.utils import flop_counter

    ops = torch.ops.aten
    forward = ops._scaled_dot_product_flash_attention_for_cpu
    backward = ops._scaled_dot_product_flash_attention_for_cpu_backward
    if forward in flop_counter.flop_registry or forward.default in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(forward)
    def _forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    @flop_counter.register_flop_formula(backward)
    def _backward(grad_out_shape, query_shape, key_shape, value_shape, *args,
                  out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape,
                                                     value_shape)


def _op_counter(counted: WorkCount) -> Any:
    """A dispatch mode that counts every aten op, and compute ops and host reads apart."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    host_read = torch.ops.aten._local_scalar_dense.default

    class OpCounter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counted.ops += 1
            if func in flop_registry or func.overloadpacket in flop_registry:
                counted.compute_ops += 1
            elif func is host_read:
                counted.host_reads += 1
            return func(*args, **(kwargs or {}))

    return OpCounter()


@contextlib.contextmanager
def count_work(into: WorkCount | None = None) -> Iterator[WorkCount]:
    """Count the FLOPs, aten ops and host reads of what runs inside the context into
    ``into`` (a new WorkCount when None), which it yields (a few microseconds per op:
    meant for one forward)."""
    from torch.utils.flop_counter import FlopCounterMode

    _count_cpu_attention()
    counted = into if into is not None else WorkCount()
    flops = FlopCounterMode(display=False)
    with flops, _op_counter(counted):
        yield counted
    counted.flops = int(flops.get_total_flops())


def matmul_rate(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a MATMUL_SIZE square matmul on ``device`` in ``dtype`` (fp32 where the
    dtype has no fast CPU matmul), the best of repeats over RATE_WINDOW_S; cached (and
    raised by a better reading after a dense reference)."""
    key = _rate_key(device, dtype)
    if key not in _RATES:
        _RATES[key] = _time_matmul(device, dtype)
    return _RATES[key]


def _rate_key(device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    import torch

    if device.type == "cpu" and dtype not in (torch.float32, torch.float64):
        dtype = torch.float32
    return str(device), str(dtype)


def _time_matmul(device: torch.device, dtype: torch.dtype) -> float:
    """One reading of the matmul rate: the best of repeats over RATE_WINDOW_S."""
    import torch

    if device.type == "cpu" and dtype not in (torch.float32, torch.float64):
        dtype = torch.float32
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=dtype)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=dtype)
    best, deadline = float("inf"), time.perf_counter() + RATE_WINDOW_S
    while time.perf_counter() < deadline or best == float("inf"):
        started = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * MATMUL_SIZE**3 / max(best, 1e-9)


def model_dim(model: nn.Module) -> int | None:
    """The model's width: the first embedding's dimension, else the widest Linear input."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return int(module.embedding_dim)
    widths = [m.in_features for m in model.modules() if isinstance(m, nn.Linear)]
    return max(widths) if widths else None


def dense_reference(batch: int, seq_len: int, dim: int, device: torch.device,
                    dtype: torch.dtype) -> dict[str, Any]:
    """Efficiency of one forward and backward of a plain causal transformer block
    [batch, seq_len, dim] (heads of 64, or one head when dim < 64): its FLOPs three times
    its forward's, counted in a warm-up run (as a trial's step 0 is), its time the best of
    TIMED_RUNS; batch and then sequence length are cut to REFERENCE_MAX_TOKENS tokens
    (``seq_len`` and ``batch`` in the result say what ran)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    batch = max(1, min(batch, REFERENCE_MAX_TOKENS // seq_len))
    seq_len = min(seq_len, REFERENCE_MAX_TOKENS)

    heads = max(1, dim // 64)
    if dim % heads:
        heads = 1
    qkv, out = nn.Linear(dim, 3 * dim).to(device), nn.Linear(dim, dim).to(device)
    up, down = nn.Linear(dim, 4 * dim).to(device), nn.Linear(4 * dim, dim).to(device)
    x = torch.randn(batch, seq_len, dim, device=device, requires_grad=True)

    def forward() -> torch.Tensor:
        q, k, v = qkv(x).view(batch, seq_len, 3, heads, dim // heads).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2), is_causal=True)
        h = x + out(attended.transpose(1, 2).reshape(batch, seq_len, dim))
        return (h + down(F.gelu(up(h)))).sum()

    # not through the work counters' wrapper (nsadiag.probes.counters), whose choice of
    # which backwards to watch must follow the target's backwards, not these
    backward = getattr(torch.autograd.backward, "__wrapped__", torch.autograd.backward)

    def step() -> None:
        backward(forward())

    with torch.autocast(device.type, dtype=dtype, enabled=dtype == torch.bfloat16):
        with count_work() as counted:  # the forward, counted as a trial's step 0 is
            loss = forward()
        backward(loss)  # with the forward: the warm-up
        seconds = float("inf")
        for _ in range(TIMED_RUNS):
            started = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = min(seconds, time.perf_counter() - started)
    key = _rate_key(device, dtype)
    rate = max(matmul_rate(device, dtype), _time_matmul(device, dtype))
    _RATES[key] = rate
    achieved = 3 * (counted.flops or 0) / max(seconds, 1e-9)  # a step is ~3 forwards
    return {"flops": 3 * (counted.flops or 0), "seconds": seconds,
            "efficiency": achieved / rate, "machine_flops_per_s": rate,
            "flops_per_op": counted.flops_per_op(), "seq_len": seq_len, "batch": batch}


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


def step_cost(measured: dict[str, Any], step_s: float | None) -> dict[str, Any] | None:
    """{"expected_s", "ratio"}: the dense reference's time here for the step's FLOPs, and
    ``step_s`` over it; None when the FLOPs, the machine's rate, the dense efficiency or
    the step time is unknown."""
    flops, rate = measured.get("flops_per_step"), measured.get("machine_flops_per_s")
    dense = measured.get("dense_efficiency")
    if not flops or not rate or not dense or not step_s or step_s <= 0:
        return None
    expected = flops / (rate * dense)
    return {"expected_s": expected, "ratio": step_s / expected}


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
    over its entries), or whose ``range`` ends within a factor of two of seq_len (and at
    MIN_HOST_READS or more): a loop over the positions, however far it got. Both are read
    from the program, not timed: load cannot make them up. None otherwise."""
    if not profile or seq_len <= 0:
        return None
    running = {_function_and_file(line["where"]) for line in profile.get("hot_lines") or []
               if line.get("phase") in ("forward", "backward")}
    for loop in profile.get("loops") or []:
        if not loop.get("by_one"):
            continue  # a stride other than one makes the value no count of iterations
        phase = loop.get("phase")
        inside = phase in ("forward", "backward") if phase is not None else \
            _function_and_file(loop["where"]) in running
        if not inside:
            continue
        reached = max(int(loop.get("last") or 0),
                      int(loop.get("advanced") or 0) // (int(loop.get("restarts") or 0) + 1))
        least = max(HOST_READS_PER_TOKEN * seq_len, MIN_HOST_READS)
        end = loop.get("end")
        over_positions = isinstance(end, int) and end >= least and end <= 2 * seq_len
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


def loop_location(loop: dict[str, Any]) -> str:
    """FILE:LINE of a profile loop's ``for`` statement (the line it was first read at
    when the source is unreadable), the file relative to the working directory when it
    lies below it."""
    file = str(loop.get("file") or _function_and_file(loop["where"])[1])
    line = loop.get("for_line") or loop["where"].rsplit(":", 1)[1].rstrip(")")
    path = Path(file)
    try:
        shown = str(path.relative_to(Path.cwd())) if path.is_absolute() else file
    except ValueError:
        shown = path.name
    return f"{shown}:{line}"


def _function_and_file(where: str) -> tuple[str, str]:
    """("forward", "model.py") of "forward (model.py:42)"."""
    function, _, rest = where.partition(" (")
    return function, rest.rsplit(":", 1)[0]
