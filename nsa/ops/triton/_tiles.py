"""Tile steps shared by the Triton kernels (inlined by Triton into each kernel).

Rows are queries (or (query, head) pairs), columns keys; scores are in units of
scale * q.k; masked entries are -inf in the forward and 0 in the backward.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def online_softmax_step(scores, v, m, denom, acc, PRECISION: tl.constexpr,
                        BASE2: tl.constexpr):
    """Fold one key tile into the running (max m [R], denominator [R], output acc [R, D]).

    scores [R, K] with -inf where masked, v [K, D]; natural logits, or log2 ones when BASE2
    (exp2 is the cheaper instruction: scale the logits by log2(e) once instead). A row that
    has seen no key keeps m = -inf; it is shifted by 0 instead, so nothing becomes NaN."""
    m_new = tl.maximum(m, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if BASE2:
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
    else:
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
    denom = denom * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, denom, acc


@triton.jit
def finish_softmax(m, denom, acc):
    """(o [R, D], lse [R]); a row that saw no key gets o = 0 and lse = -inf."""
    seen = denom > 0
    safe = tl.where(seen, denom, 1.0)
    o = tl.where(seen[:, None], acc / safe[:, None], 0.0)
    lse = tl.where(seen, m + tl.log(safe), float("-inf"))
    return o, lse


@triton.jit
def load_stats(LSE, DELTA, offsets, ok):
    """lse and delta = rowsum(o * do) of the rows at `offsets`; lse = -inf reads as 0 (such
    a row has no allowed key, so its probabilities are masked to 0 anyway)."""
    lse = tl.load(LSE + offsets, mask=ok, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    delta = tl.load(DELTA + offsets, mask=ok, other=0.0)
    return lse, delta


@triton.jit
def probs_and_score_grads(q, k, v, do, lse, delta, allowed, scale, PRECISION: tl.constexpr):
    """p [R, K] = exp(scale q.k - lse) where allowed, else 0; ds = p * (do.v - delta)."""
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    p = tl.where(allowed, tl.exp(scores - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def tile_offsets(b, pos, head, stride_b, stride_s, stride_h, cols):
    """[P, D] element offsets of the rows at positions `pos` [P] of one head of batch b."""
    return b * stride_b + pos[:, None] * stride_s + head * stride_h + cols[None, :]


@triton.jit
def load_pair(X, Y, offsets, ok):
    """X and Y at the same [P, D] offsets (q and do, or k and v); rows not ok read 0."""
    return (tl.load(X + offsets, mask=ok[:, None], other=0.0),
            tl.load(Y + offsets, mask=ok[:, None], other=0.0))


@triton.jit
def _row_dot(A, B, OUT, n_rows, WIDTH: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = rows < n_rows
    offsets = rows[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
    a = tl.load(A + offsets, mask=ok[:, None], other=0.0).to(tl.float32)
    b = tl.load(B + offsets, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(OUT + rows, tl.sum(a * b, 1), mask=ok)


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 [...] = sum over the last dimension of a * b (the backward's delta = rowsum(o * do)),
    without fp32 copies of a and b; a, b [..., D] of one shape, D a power of two."""
    a, b = a.contiguous(), b.contiguous()
    width = a.shape[-1]
    out = torch.empty(a.shape[:-1], device=a.device, dtype=torch.float32)
    n_rows = out.numel()
    rows = max(1, 4096 // width)
    if n_rows:
        _row_dot[(triton.cdiv(n_rows, rows),)](a, b, out, n_rows, WIDTH=width, ROWS=rows)
    return out
