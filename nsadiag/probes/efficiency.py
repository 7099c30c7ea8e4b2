"""How much of this machine's arithmetic a training step uses: the counts and rates that tell
slow by size from slow by defect (nsadiag.verdict.size_or_defect reads them).

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
- ``step_cost(measured, step_s)``: a step's time against its expected cost, the time the
  dense reference would take here for the step's FLOPs (FLOPs over the dense block's
  achieved FLOP/s, i.e. over this machine's matmul rate times the dense efficiency). The
  matmul rate cancels out of the ratio, so a noisy rate reading does not move it.

torch is imported by the functions that use it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

MATMUL_SIZE = 512
TIMED_RUNS = 3
REFERENCE_MAX_TOKENS = 4096
"""The dense reference runs at most this many tokens (batch x sequence): its efficiency
hardly changes beyond, and a long sequence's full attention matrix would not fit."""
RATE_WINDOW_S = 0.15
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
