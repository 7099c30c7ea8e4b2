"""The gated sum of the branch outputs (NSA Eq.5) in Triton: o = sum_c g_c * o_c.

Same contract as `nsa.ops.mix.gated_sum`, with the gates stacked: outputs o_c [B, S, H, D]
(one dtype), gates [B, S, H, C] (column c gates output c). Backward:
    d o_c = g_c * d o        d g_c = <o_c, d o> over D
Forward reads each output once and writes o; backward reads d o and each output once and
writes every d o_c and d g in the same pass (fp32 arithmetic, no temporaries). The
per-row dot products of the torch version are a batched matrix product of 1 x D by D x 1
matrices, which a GPU runs as millions of tiny products.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["gated_sum"]

ROWS = 32
"""(position, head) rows per program."""


@triton.jit
def _load_rows(X, offsets, ok):
    return tl.load(X + offsets, mask=ok[:, None], other=0.0).to(tl.float32)


@triton.jit
def _gated_sum_fwd(O0, O1, O2, G, OUT, n_rows, BRANCHES: tl.constexpr, WIDTH: tl.constexpr,
                   ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = rows < n_rows
    offsets = rows[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
    gates = G + rows * BRANCHES
    acc = _load_rows(O0, offsets, ok) * tl.load(gates, mask=ok, other=0.0).to(tl.float32)[:, None]
    if BRANCHES > 1:
        g = tl.load(gates + 1, mask=ok, other=0.0).to(tl.float32)
        acc += _load_rows(O1, offsets, ok) * g[:, None]
    if BRANCHES > 2:
        g = tl.load(gates + 2, mask=ok, other=0.0).to(tl.float32)
        acc += _load_rows(O2, offsets, ok) * g[:, None]
    tl.store(OUT + offsets, acc.to(OUT.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _branch_grads(O, DO_C, G, DG, grad, offsets, rows, ok, c, BRANCHES: tl.constexpr):
    g = tl.load(G + rows * BRANCHES + c, mask=ok, other=0.0).to(tl.float32)
    tl.store(DO_C + offsets, (grad * g[:, None]).to(DO_C.dtype.element_ty), mask=ok[:, None])
    dot = tl.sum(_load_rows(O, offsets, ok) * grad, 1)
    tl.store(DG + rows * BRANCHES + c, dot.to(DG.dtype.element_ty), mask=ok)


@triton.jit
def _gated_sum_bwd(GRAD, O0, O1, O2, G, DO0, DO1, DO2, DG, n_rows, BRANCHES: tl.constexpr,
                   WIDTH: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = rows < n_rows
    offsets = rows[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
    grad = _load_rows(GRAD, offsets, ok)
    _branch_grads(O0, DO0, G, DG, grad, offsets, rows, ok, 0, BRANCHES)
    if BRANCHES > 1:
        _branch_grads(O1, DO1, G, DG, grad, offsets, rows, ok, 1, BRANCHES)
    if BRANCHES > 2:
        _branch_grads(O2, DO2, G, DG, grad, offsets, rows, ok, 2, BRANCHES)


def _padded(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Three pointers for the kernels' three slots; unused slots repeat the first."""
    return tensors + [tensors[0]] * (3 - len(tensors))


class _GatedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gates, *outputs):
        outputs = [o.contiguous() for o in outputs]
        gates = gates.contiguous()
        out = torch.empty_like(outputs[0])
        n_rows, width = gates.shape[:-1].numel(), out.shape[-1]
        if n_rows:
            _gated_sum_fwd[(triton.cdiv(n_rows, ROWS),)](
                *_padded(outputs), gates, out, n_rows, BRANCHES=len(outputs), WIDTH=width,
                ROWS=ROWS)
        ctx.save_for_backward(gates, *outputs)
        return out

    @staticmethod
    def backward(ctx, grad):
        gates, *outputs = ctx.saved_tensors
        grad = grad.contiguous()
        d_outputs = [torch.empty_like(o) for o in outputs]
        d_gates = torch.empty_like(gates)
        n_rows, width = gates.shape[:-1].numel(), grad.shape[-1]
        if n_rows:
            _gated_sum_bwd[(triton.cdiv(n_rows, ROWS),)](
                grad, *_padded(outputs), gates, *_padded(d_outputs), d_gates, n_rows,
                BRANCHES=len(outputs), WIDTH=width, ROWS=ROWS)
        return (d_gates, *d_outputs)


def gated_sum(outputs: list[torch.Tensor], gates: torch.Tensor) -> torch.Tensor:
    """sum_c gates[..., c, None] * outputs[c]: outputs 1 to 3 tensors [B, S, H, D] of one
    dtype (D a power of two), gates [B, S, H, len(outputs)] -> [B, S, H, D]."""
    if not 1 <= len(outputs) <= 3 or gates.shape != (*outputs[0].shape[:-1], len(outputs)):
        raise ValueError(f"gated_sum: need 1 to 3 outputs [B, S, H, D] and gates [B, S, H, "
                         f"{len(outputs)}]; got {len(outputs)} outputs and gates "
                         f"{tuple(gates.shape)}")
    for o in outputs:
        if o.shape != outputs[0].shape or o.dtype != outputs[0].dtype:
            raise ValueError(f"gated_sum: outputs must share one shape and dtype; got "
                             f"{tuple(o.shape)} {o.dtype} and {tuple(outputs[0].shape)} "
                             f"{outputs[0].dtype}")
    return _GatedSum.apply(gates, *outputs)
