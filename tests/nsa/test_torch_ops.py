"""The memory-bounded torch ops against the dense-mask oracle (nsa.ops.naive), fp32 on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from nsa.config import NSAConfig, num_compressed
from nsa.ops import shift
from nsa.ops.indices import unique_block_indices
from nsa.ops.naive import compressed_visibility, masked_attention, selection_mask, window_mask
from nsa.ops.selection import select_blocks
from nsa.ops.torch import (
    compressed_attention,
    compressed_attention_and_selection,
    selected_attention,
    selected_attention_with_lse,
    window_attention,
    window_attention_with_lse,
)
from tests.helpers import (
    HEAD_DIM,
    assert_close,
    attention_inputs,
    grads_of,
    has_repeats,
    random_indices,
    with_repeats,
)


def _selected_reference(q, k, v, idx, block_size):
    mask = selection_mask(idx, q.shape[1], block_size)
    return masked_attention(q, k, v, mask)


@pytest.fixture(params=["unshifted", "row-max"])
def exp_shift(request, monkeypatch):
    """Both softmax paths of the compressed and sparse selected ops: logits exponentiated as
    they are (nsa.ops.shift's bound holds for these unit-scale inputs) and shifted by the row
    maximum (the bound set to 0, so no call qualifies)."""
    if request.param == "row-max":
        monkeypatch.setattr(shift, "EXP_BOUND", 0.0)
    return request.param


def _check_path(exp_shift, q, k, scale):
    """The inputs take the path the test is named for."""
    expected = exp_shift == "unshifted"
    assert shift.unshifted_exp_is_safe(q.detach(), k.detach(), scale) is expected


@pytest.mark.parametrize("seq,n_q_heads,n_kv_heads,block_size,n_sel,chunk", [
    (37, 2, 2, 8, 3, 16),
    (50, 4, 2, 8, 4, 16),
    (70, 4, 1, 8, 5, 16),
    (50, 8, 2, 8, 7, 128),  # one tile larger than S, every block selectable
    (33, 2, 1, 4, 6, 7),
])
@pytest.mark.parametrize("dense_factor", [0.0, 1.0, math.inf], ids=["blockwise", "mixed", "dense"])
def test_selected_matches_oracle(seq, n_q_heads, n_kv_heads, block_size, n_sel, chunk,
                                 dense_factor, exp_shift):
    batch = 2
    n_blocks = -(-seq // block_size)
    q, k, v, grad_o = attention_inputs(batch, seq, n_q_heads, n_kv_heads)
    _check_path(exp_shift, q, k, HEAD_DIM ** -0.5)
    idx = random_indices(batch, seq, n_kv_heads, n_sel, n_blocks)
    o, lse = selected_attention_with_lse(q, k, v, idx, block_size, query_chunk=chunk,
                                         dense_factor=dense_factor)
    o_ref, lse_ref = _selected_reference(q, k, v, idx, block_size)
    empty = torch.isinf(lse_ref)
    assert empty.any() and (~empty).any()
    assert torch.equal(torch.isinf(lse), empty)
    assert (o.detach()[empty] == 0).all()
    assert_close([o, lse[~empty]], [o_ref, lse_ref[~empty]])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


@pytest.mark.parametrize("chunk_floats", [1 << 21, 1 << 12], ids=["one-chunk", "many-chunks"])
@pytest.mark.parametrize("seq,n_q_heads,n_kv_heads,block_size,n_sel", [
    (300, 4, 2, 16, 4),  # dense below t = 128, sparse tiles of 48 queries above
    (333, 6, 2, 16, 5),  # G = 3, S not a multiple of the block
    (700, 8, 2, 64, 4),  # the paper's block size: dense below t = 512, sparse after
])
def test_selected_long_sequences_cross_both_paths(seq, n_q_heads, n_kv_heads, block_size, n_sel,
                                                  chunk_floats, monkeypatch, exp_shift):
    """The default split (dense for early queries, sparse after) over several sparse tiles,
    and with chunks small enough that one tile rescales its running softmax many times."""
    from nsa.ops.torch import selected, selected_blocks

    monkeypatch.setattr(selected_blocks, "_CHUNK_FLOATS", chunk_floats)
    batch = 2
    q, k, v, grad_o = attention_inputs(batch, seq, n_q_heads, n_kv_heads, head_dim=16)
    _check_path(exp_shift, q, k, 16 ** -0.5)
    idx = random_indices(batch, seq, n_kv_heads, n_sel, -(-seq // block_size))
    tiler = selected._Tiler(q, k, idx, block_size, 64, selected.DENSE_FACTOR)
    assert 0 < tiler.sparse_start < seq
    assert len(selected_blocks.tiles(tiler.sparse_start, seq, block_size)) > 1
    o, lse = selected_attention_with_lse(q, k, v, idx, block_size, query_chunk=64)
    o_ref, lse_ref = _selected_reference(q, k, v, idx, block_size)
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen)
    assert_close([o, lse[seen]], [o_ref, lse_ref[seen]])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


def test_unique_block_indices_keeps_first_occurrences():
    idx = torch.tensor([[3, 1, 3, -1, 1, 3], [0, 0, 0, 0, 0, 0], [-1, -1, 2, -5, -5, 7]])
    want = torch.tensor([[3, 1, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1],
                         [-1, -1, 2, -5, -1, 7]])
    assert torch.equal(unique_block_indices(idx), want)
    rows = random_indices(2, 30, 2, 4, 8)  # no repeats: unchanged
    assert torch.equal(unique_block_indices(rows), rows)


@pytest.mark.parametrize("dense_factor", [0.0, 1.0, math.inf], ids=["blockwise", "mixed", "dense"])
def test_selected_repeated_indices_count_once(dense_factor):
    """A block listed twice in a row is attended once, on every path (the oracle's mask is a
    set of keys, so it counts a block once by construction)."""
    batch, seq, block_size, n_sel = 2, 300, 16, 5
    q, k, v, grad_o = attention_inputs(batch, seq, 4, 2, head_dim=16)
    unique = random_indices(batch, seq, 2, n_sel, -(-seq // block_size))
    idx = with_repeats(unique)
    repeats = has_repeats(idx)
    assert repeats[:, :128].any() and repeats[:, 128:].any()  # before and after t = 128
    o, lse = selected_attention_with_lse(q, k, v, idx, block_size, query_chunk=32,
                                         dense_factor=dense_factor)
    o_ref, lse_ref = _selected_reference(q, k, v, unique_block_indices(idx), block_size)
    assert torch.equal(selection_mask(idx, seq, block_size),
                       selection_mask(unique_block_indices(idx), seq, block_size))
    seen = torch.isfinite(lse_ref)
    assert_close([o, lse[seen]], [o_ref, lse_ref[seen]])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


PATHS = pytest.mark.parametrize("dense_factor", [0.0, math.inf], ids=["blockwise", "dense"])


@PATHS
def test_selected_all_padding_gives_zeros(dense_factor):
    q, k, v, grad_o = attention_inputs(1, 20, 4, 2)
    idx = torch.full((1, 20, 2, 3), -1, dtype=torch.long)
    o = selected_attention(q, k, v, idx, 8, query_chunk=8, dense_factor=dense_factor)
    assert (o == 0).all()
    grads = grads_of(o, grad_o, q, k, v)
    assert all((g == 0).all() for g in grads)


@PATHS
def test_selected_future_blocks_are_masked(dense_factor):
    seq, block_size = 24, 8
    q, k, v, grad_o = attention_inputs(1, seq, 2, 1)
    # every query selects all blocks: identical to causal attention
    idx = torch.arange(3).expand(1, seq, 1, 3).contiguous()
    o = selected_attention(q, k, v, idx, block_size, query_chunk=5, dense_factor=dense_factor)
    causal = torch.ones(seq, seq).tril().bool().view(1, seq, 1, seq)
    o_ref, _ = masked_attention(q, k, v, causal)
    assert_close([o], [o_ref])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


@pytest.mark.parametrize("seq,n_q_heads,n_kv_heads,window,chunk", [
    (37, 2, 2, 1, 16),
    (50, 4, 2, 5, 16),
    (70, 4, 1, 20, 16),
    (50, 8, 2, 64, 16),  # window larger than S: causal attention
    (37, 4, 4, 11, 128),  # one tile larger than S
])
def test_window_matches_oracle(seq, n_q_heads, n_kv_heads, window, chunk):
    batch = 2
    q, k, v, grad_o = attention_inputs(batch, seq, n_q_heads, n_kv_heads)
    o, lse = window_attention_with_lse(q, k, v, window, query_chunk=chunk)
    mask = window_mask(seq, window).view(1, seq, 1, seq).expand(batch, seq, n_kv_heads, seq)
    o_ref, lse_ref = masked_attention(q, k, v, mask)
    assert_close([o, lse], [o_ref, lse_ref])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


@pytest.mark.parametrize("call_floats", [1 << 21, 1 << 12], ids=["one-call", "many-calls"])
@pytest.mark.parametrize("seq,window,chunk", [(300, 40, 32), (300, 100, 128), (200, 512, 256)])
def test_window_long_sequences_match_oracle(seq, window, chunk, call_floats, monkeypatch):
    """Many tiles, batched per kernel call, the first ones masking the front padding."""
    from nsa.ops.torch import window as window_module

    monkeypatch.setattr(window_module, "_CALL_FLOATS", call_floats)
    q, k, v, grad_o = attention_inputs(2, seq, 6, 2, head_dim=16)
    o, lse = window_attention_with_lse(q, k, v, window, query_chunk=chunk)
    mask = window_mask(seq, window).view(1, seq, 1, seq).expand(2, seq, 2, seq)
    o_ref, lse_ref = masked_attention(q, k, v, mask)
    assert_close([o, lse], [o_ref, lse_ref])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


@pytest.mark.parametrize("seq,n_q_heads,n_kv_heads,block_len,stride,chunk", [
    (37, 2, 2, 8, 4, 16),
    (50, 4, 2, 16, 8, 16),
    (70, 4, 1, 8, 8, 16),
    (64, 8, 2, 32, 16, 128),
    (45, 4, 2, 8, 2, 9),
    (70, 4, 1, 32, 8, 16),  # the first tile sees no token at all
])
def test_compressed_matches_oracle(seq, n_q_heads, n_kv_heads, block_len, stride, chunk):
    batch = 2
    cfg = NSAConfig(l=block_len, d=stride)
    n_cmp = num_compressed(seq, cfg)
    q, k, v, grad_o = attention_inputs(batch, seq, n_q_heads, n_kv_heads, n_keys=n_cmp)
    o, lse = compressed_attention(q, k, v, block_len, stride, query_chunk=chunk)
    visible = compressed_visibility(seq, cfg)
    mask = visible.view(1, seq, 1, n_cmp).expand(batch, seq, n_kv_heads, n_cmp)
    o_ref, lse_ref = masked_attention(q, k, v, mask)
    empty = torch.isinf(lse_ref)
    assert empty.any() and (~empty).any()
    assert torch.equal(torch.isinf(lse), empty) and (lse[empty] < 0).all()
    assert not lse.requires_grad
    assert_close([o, lse[~empty]], [o_ref, lse_ref[~empty]])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


@pytest.mark.parametrize("seq,n_q_heads,n_kv_heads,block_len,stride,l_sel,chunk", [
    (37, 2, 2, 8, 4, 8, 16),
    (50, 4, 2, 16, 8, 16, 16),
    (130, 4, 1, 8, 4, 16, 32),
    (70, 4, 1, 32, 8, 32, 16),  # the first tile sees no token at all
    (10, 4, 2, 16, 8, 16, 4),  # shorter than block_len: no compressed token
])
def test_compressed_with_selection_matches_oracle_and_select_blocks(
        seq, n_q_heads, n_kv_heads, block_len, stride, l_sel, chunk, exp_shift):
    """One pass gives the oracle's compressed o, lse and gradients, and exactly the block
    indices `select_blocks` ranks on its own."""
    batch = 2
    cfg = NSAConfig(l=block_len, d=stride, l_sel=l_sel, n_sel=3).validate()
    n_cmp = num_compressed(seq, cfg)
    q, k, v, grad_o = attention_inputs(batch, seq, n_q_heads, n_kv_heads, n_keys=n_cmp)
    if n_cmp:
        _check_path(exp_shift, q, k, HEAD_DIM ** -0.5)
    o, lse, indices = compressed_attention_and_selection(q, k, v, cfg, query_chunk=chunk)
    assert not lse.requires_grad and not indices.requires_grad
    assert torch.equal(indices, select_blocks(q, k, cfg, 1 / math.sqrt(HEAD_DIM), chunk))
    visible = compressed_visibility(seq, cfg)
    mask = visible.view(1, seq, 1, n_cmp).expand(batch, seq, n_kv_heads, n_cmp)
    o_ref, lse_ref = masked_attention(q, k, v, mask)
    empty = torch.isinf(lse_ref)
    assert empty.any()
    assert torch.equal(torch.isinf(lse), empty) and (lse[empty] < 0).all()
    assert_close([o, lse[~empty]], [o_ref, lse_ref[~empty]])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


def test_large_logits_take_the_row_maximum_and_match_the_oracle():
    """Logits past exp's fp32 range (|scale * q.k| > 88: exp overflows) fail the bound, so the
    compressed and sparse selected ops shift by the row maximum: outputs, lse and gradients
    stay finite and equal a float64 oracle's to within fp32's rounding of the logits (about
    1e-7 of their size: the tolerance, relative to each tensor's largest entry, scales with
    the largest logit)."""
    seq, block_size = 200, 16
    cfg = NSAConfig(l=16, d=8, l_sel=block_size, n_sel=4).validate()
    q, k, v, grad_o = attention_inputs(1, seq, 4, 2, head_dim=16)
    q = (q.detach() * 25).requires_grad_()
    logits = torch.einsum("bshd,bnhd->bshn", q, k.repeat_interleave(2, dim=2)) * 0.25
    largest = logits.abs().max().item()
    assert largest > 88 and not shift.unshifted_exp_is_safe(q.detach(), k.detach(), 0.25)
    tol = 1e-6 * largest

    def close(got, want):
        assert_close([g / w.abs().max().clamp_min(1) for g, w in zip(got, want, strict=True)],
                     [w / w.abs().max().clamp_min(1) for w in want], tol)

    def oracle(mask, k_part, v_part):
        leaves = [x.detach().double().requires_grad_() for x in (q, k_part, v_part)]
        o_ref, lse_ref = masked_attention(*leaves, mask)
        return o_ref, lse_ref, grads_of(o_ref, grad_o.double(), *leaves)

    idx = random_indices(1, seq, 2, 4, -(-seq // block_size))
    o, lse = selected_attention_with_lse(q, k, v, idx, block_size, query_chunk=32,
                                         dense_factor=0.0)
    o_ref, lse_ref, grads_ref = oracle(selection_mask(idx, seq, block_size), k, v)
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen)
    close([o, lse[seen], *grads_of(o, grad_o, q, k, v)], [o_ref, lse_ref[seen], *grads_ref])

    n_cmp = num_compressed(seq, cfg)
    k_cmp, v_cmp = k[:, :n_cmp], v[:, :n_cmp]
    o, lse, indices = compressed_attention_and_selection(q, k_cmp, v_cmp, cfg, query_chunk=32)
    assert torch.equal(indices, select_blocks(q, k_cmp, cfg, 0.25, 32))
    visible = compressed_visibility(seq, cfg).view(1, seq, 1, n_cmp).expand(1, seq, 2, n_cmp)
    o_ref, lse_ref, grads_ref = oracle(visible, k_cmp, v_cmp)
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen)
    close([o, lse[seen], *grads_of(o, grad_o, q, k_cmp, v_cmp)],
          [o_ref, lse_ref[seen], *grads_ref])


def test_compressed_sequence_shorter_than_block_len():
    seq, block_len, stride = 10, 16, 8
    n_cmp = num_compressed(seq, NSAConfig(l=block_len, d=stride))
    assert n_cmp == 0
    q, k, v, grad_o = attention_inputs(2, seq, 4, 2, n_keys=n_cmp)
    o, lse = compressed_attention(q, k, v, block_len, stride, query_chunk=4)
    assert (o == 0).all() and torch.isneginf(lse).all()
    dq, dk, dv = grads_of(o, grad_o, q, k, v)
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape


def test_query_chunk_does_not_change_results():
    seq, block_size = 64, 8
    q, k, v, grad_o = attention_inputs(2, seq, 4, 2, head_dim=16)
    idx = random_indices(2, seq, 2, 4, seq // block_size)
    runs = {
        "sel-blockwise": lambda c: selected_attention(q, k, v, idx, block_size, query_chunk=c,
                                                   dense_factor=0.0),
        "sel-dense": lambda c: selected_attention(q, k, v, idx, block_size, query_chunk=c,
                                                  dense_factor=math.inf),
        "win": lambda c: window_attention(q, k, v, 12, query_chunk=c),
        "cmp": lambda c: compressed_attention(q, k[:, :13], v[:, :13], 16, 4, query_chunk=c)[0],
    }
    for name, run in runs.items():
        one, two = run(64), run(32)
        got = [two, *grads_of(two, grad_o, q, k, v)]
        want = [one, *grads_of(one, grad_o, q, k, v)]
        # dK/dV sum over tiles in a different order, so they agree to 1e-6 relative
        for g, w in zip(got, want, strict=True):
            assert (g - w).abs().max().item() <= 1e-6 * max(1.0, w.abs().max().item()), name


def test_unfused_tile_math_matches_oracle(monkeypatch):
    """The tile math that serves devices without aten's fused CPU kernel, run on the CPU."""
    from nsa.ops.torch import _tiles, selected, window

    for module in (_tiles, selected, window):
        monkeypatch.setattr(module, "use_fused_kernel", lambda device: False)
    batch, seq, block_size = 2, 90, 8
    q, k, v, grad_o = attention_inputs(batch, seq, 4, 2)
    idx = random_indices(batch, seq, 2, 4, -(-seq // block_size))
    cfg = NSAConfig(l=8, d=4)
    n_cmp = num_compressed(seq, cfg)
    cases = {
        "sel": (lambda: selected_attention(q, k, v, idx, block_size, query_chunk=16,
                                           dense_factor=2.0),
                selection_mask(idx, seq, block_size), (k, v)),
        "win": (lambda: window_attention(q, k, v, 11, query_chunk=16),
                window_mask(seq, 11).view(1, seq, 1, seq).expand(batch, seq, 2, seq), (k, v)),
        "cmp": (lambda: compressed_attention(q, k[:, :n_cmp], v[:, :n_cmp], 8, 4,
                                             query_chunk=16)[0],
                compressed_visibility(seq, cfg).view(1, seq, 1, n_cmp).expand(batch, seq, 2,
                                                                              n_cmp),
                (k[:, :n_cmp], v[:, :n_cmp])),
    }
    for run, mask, (keys, values) in cases.values():
        o = run()
        o_ref, _ = masked_attention(q, keys, values, mask)
        assert_close([o], [o_ref])
        assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


def test_sparse_selected_and_window_are_deterministic(monkeypatch):
    """Reruns give identical bits (fixed summation orders: dQ rows and dK/dV blocks with
    index_add_, window slices in tile order), also with many chunks and kernel calls."""
    from nsa.ops.torch import selected_blocks, window

    monkeypatch.setattr(selected_blocks, "_CHUNK_FLOATS", 1 << 12)
    monkeypatch.setattr(window, "_CALL_FLOATS", 1 << 12)
    q, k, v, grad_o = attention_inputs(2, 300, 4, 2, head_dim=16)
    idx = random_indices(2, 300, 2, 5, -(-300 // 16))
    for run in (lambda: selected_attention(q, k, v, idx, 16, query_chunk=32, dense_factor=0.0),
                lambda: window_attention(q, k, v, 40, query_chunk=32)):
        first, second = run(), run()
        got = [first.detach(), *grads_of(first, grad_o, q, k, v)]
        again = [second.detach(), *grads_of(second, grad_o, q, k, v)]
        assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True))


def _saved_bytes(run) -> int:
    """Bytes of the tensors autograd saves while `run()` builds its graph."""
    total = 0

    def pack(x: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += x.numel() * x.element_size()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        run()
    return total


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@PATHS
def test_selected_saved_memory_is_bounded(dense_factor):
    batch, seq, n_q_heads, n_kv_heads, block_size = 1, 80, 4, 2, 4
    q, k, v, _ = attention_inputs(batch, seq, n_q_heads, n_kv_heads)
    saved = {}
    for n_sel in (4, 16):
        idx = random_indices(batch, seq, n_kv_heads, n_sel, seq // block_size)

        def run(idx=idx):
            return selected_attention_with_lse(q, k, v, idx, block_size, query_chunk=16,
                                               dense_factor=dense_factor)
        o, lse = run()
        saved[n_sel] = _saved_bytes(run)
        assert saved[n_sel] < _nbytes(q, k, v, idx, o, lse) * 1.01
    index_growth = batch * seq * n_kv_heads * (16 - 4) * 8
    assert saved[16] - saved[4] == index_growth


@pytest.mark.parametrize("branch", ["win", "cmp"])
def test_dense_band_saved_memory_is_bounded(branch):
    q, k, v, _ = attention_inputs(2, 80, 4, 2)
    if branch == "win":
        def run():
            return window_attention_with_lse(q, k, v, 16, query_chunk=16)
    else:
        k, v = k[:, :17].detach().requires_grad_(), v[:, :17].detach().requires_grad_()

        def run():
            return compressed_attention(q, k, v, 16, 4, query_chunk=16)
    o, lse = run()
    assert _saved_bytes(run) < _nbytes(q, k, v, o, lse) * 1.01


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_keep_their_dtype(dtype):
    q, k, v, grad_o = (t.detach().to(dtype).requires_grad_() for t in attention_inputs(1, 24, 4, 2))
    idx = random_indices(1, 24, 2, 2, 3)
    outs = [selected_attention(q, k, v, idx, 8, query_chunk=8, dense_factor=0.0),
            selected_attention(q, k, v, idx, 8, query_chunk=8, dense_factor=math.inf),
            window_attention(q, k, v, 5, query_chunk=8),
            compressed_attention(q, k[:, :5], v[:, :5], 8, 4, query_chunk=8)[0]]
    for o in outs:
        assert o.dtype == dtype and torch.isfinite(o).all()
        grads = grads_of(o, grad_o.to(dtype), q, k, v)
        assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


def test_non_contiguous_inputs():
    """k, v split from one projection (the layer's layout) and a transposed q."""
    torch.manual_seed(0)
    batch, seq, n_q_heads, n_kv_heads = 2, 40, 4, 2
    q = torch.randn(batch, n_q_heads, seq, HEAD_DIM).transpose(1, 2).requires_grad_()
    kv = torch.randn(batch, seq, 2, n_kv_heads, HEAD_DIM, requires_grad=True)
    k, v = kv.unbind(2)
    grad_o = torch.randn(batch, seq, n_q_heads, HEAD_DIM).transpose(1, 2).contiguous()
    grad_o = grad_o.transpose(1, 2)  # a non-contiguous upstream gradient too
    idx = random_indices(batch, seq, n_kv_heads, 3, 5)
    kc, vc = k[:, :7], v[:, :7]
    runs = [
        (lambda a, b, c: selected_attention(a, b, c, idx, 8, query_chunk=16, dense_factor=0.0),
         selection_mask(idx, seq, 8)),
        (lambda a, b, c: selected_attention(a, b, c, idx, 8, query_chunk=16,
                                            dense_factor=math.inf),
         selection_mask(idx, seq, 8)),
        (lambda a, b, c: window_attention(a, b, c, 6, query_chunk=16),
         window_mask(seq, 6).view(1, seq, 1, seq).expand(batch, seq, n_kv_heads, seq)),
    ]
    for run, mask in runs:
        o = run(q, k, v)
        o_ref, _ = masked_attention(q, k, v, mask)
        assert_close([o], [o_ref])
        assert_close(grads_of(o, grad_o, q, kv), grads_of(o_ref, grad_o, q, kv))
    o, _ = compressed_attention(q, kc, vc, 8, 4, query_chunk=16)
    cfg = NSAConfig(l=8, d=4)
    mask = compressed_visibility(seq, cfg)[:, :7].view(1, seq, 1, 7).expand(batch, seq,
                                                                             n_kv_heads, 7)
    o_ref, _ = masked_attention(q, kc, vc, mask)
    assert_close([o], [o_ref])
    assert_close(grads_of(o, grad_o, q, kv), grads_of(o_ref, grad_o, q, kv))
