"""The Triton kernels under the CPU interpreter against the dense oracle: forward and every
gradient in fp32 (<= 1e-5) and fp16 (<= 2e-2 of the output scale), determinism, the dK/dV
work-item split, routing and shape limits. Skipped where the kernels are compiled for a GPU
(tests/nsa/test_triton_gpu.py covers that case)."""

import subprocess
import sys

import pytest
import torch

from nsa.config import num_compressed
from nsa.layer import NSAAttention
from nsa.ops.naive import compressed_visibility, masked_attention, selection_mask, window_mask

pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[triton]')")

from nsa.ops.triton import ops, selected  # noqa: E402
from nsa.ops.triton._common import unsupported_reason
from tests.helpers import (
    assert_close,
    attention_inputs,
    grads_of,
    has_repeats,
    random_indices,
    tiny_config,
    with_repeats,
)

pytestmark = pytest.mark.skipif(not ops.INTERPRETED,
                                reason="kernels compiled for a GPU; see test_triton_gpu.py")

TOL = 1e-5
FP16_TOL = 2e-2
SCALE = 0.25


def _selected_case(seq, n_q_heads, n_kv_heads, block_size, n_sel, head_dim, dtype=torch.float32):
    q, k, v, grad_o = attention_inputs(1, seq, n_q_heads, n_kv_heads, head_dim=head_dim)
    idx = random_indices(1, seq, n_kv_heads, n_sel, -(-seq // block_size))
    mask = selection_mask(idx, seq, block_size)
    want = masked_attention(q, k, v, mask, SCALE)
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    got = ops.selected_attention_with_lse(*low, idx, block_size, SCALE)
    return got, want, low, (q, k, v), grad_o


def _assert_fp16_close(got, want):
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        scale = w.float().abs().max().clamp(min=1e-6)
        err = ((g.float() - w.float()).abs().max() / scale).item()
        assert err <= FP16_TOL, f"tensor {i}: error {err:.3e} of its scale"


@pytest.mark.parametrize("seq,n_q_heads,n_kv_heads,block_size,n_sel,head_dim", [
    (40, 4, 2, 16, 3, 16),  # G = 2
    (45, 3, 1, 16, 4, 32),  # G = 3: a group that is not a power of two
    (33, 2, 2, 16, 2, 16),  # G = 1, S not a multiple of the block
    (36, 16, 1, 32, 2, 16),  # G = 16 fills the tile
    (20, 8, 2, 16, 2, 64),  # head_dim 64
    (18, 2, 1, 16, 2, 128),  # head_dim 128
])
def test_selected_matches_oracle_fp32(seq, n_q_heads, n_kv_heads, block_size, n_sel, head_dim):
    (o, lse), (o_ref, lse_ref), low, leaves, grad_o = _selected_case(
        seq, n_q_heads, n_kv_heads, block_size, n_sel, head_dim)
    assert_close([o], [o_ref])
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen)
    assert_close([lse[seen]], [lse_ref[seen]])
    assert_close(grads_of(o, grad_o, *low), grads_of(o_ref, grad_o, *leaves))


def test_selected_matches_oracle_fp16():
    (o, _), (o_ref, _), low, leaves, grad_o = _selected_case(40, 4, 2, 16, 3, 32, torch.float16)
    assert o.dtype == torch.float16
    _assert_fp16_close([o, *grads_of(o, grad_o.half(), *low)],
                       [o_ref, *grads_of(o_ref, grad_o, *leaves)])


def test_selected_backward_is_deterministic_and_splits_long_query_lists(monkeypatch):
    (o, _), (o_ref, _), low, leaves, grad_o = _selected_case(40, 4, 2, 16, 3, 16)
    first = grads_of(o, grad_o, *low)
    monkeypatch.setattr(selected, "ITEM_QUERIES", 3)  # every block's list spans several items
    o2, _ = ops.selected_attention_with_lse(*low, random_indices(1, 40, 2, 3, 3), 16, SCALE)
    split = list(torch.autograd.grad(o2, low, grad_o, retain_graph=True))
    again = grads_of(o2, grad_o, *low)
    assert all(torch.equal(a, b) for a, b in zip(split, again, strict=True))
    assert_close(split, first)
    assert_close(split, grads_of(o_ref, grad_o, *leaves))


def test_selected_repeated_indices_count_once():
    """A block listed twice in a row is attended once, as on the torch backend."""
    q, k, v, grad_o = attention_inputs(1, 40, 4, 2, head_dim=16)
    idx = with_repeats(random_indices(1, 40, 2, 3, 3))
    assert has_repeats(idx).any()
    o, lse = ops.selected_attention_with_lse(q, k, v, idx, 16, SCALE)
    o_ref, lse_ref = masked_attention(q, k, v, selection_mask(idx, 40, 16), SCALE)
    seen = torch.isfinite(lse_ref)
    assert_close([o, lse[seen]], [o_ref, lse_ref[seen]])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


def test_selected_rows_without_visible_keys_give_zeros():
    q, k, v, grad_o = attention_inputs(1, 20, 2, 1, head_dim=16)
    idx = torch.full((1, 20, 1, 2), -1, dtype=torch.long)
    idx[:, :, :, 0] = 1  # block 1 starts at 16: in the future of queries 0..15
    o, lse = ops.selected_attention_with_lse(q, k, v, idx, 16, SCALE)
    assert torch.equal(o[:, :16], torch.zeros_like(o[:, :16]))
    assert torch.isinf(lse[:, :16]).all() and torch.isfinite(lse[:, 16:]).all()
    dq, dk, dv = grads_of(o, grad_o, q, k, v)
    assert torch.equal(dq[:, :16], torch.zeros_like(dq[:, :16]))
    assert torch.equal(dk[:, :16], torch.zeros_like(dk[:, :16]))


def _window_reference(q, k, v, window):
    batch, seq, _, _ = q.shape
    mask = window_mask(seq, window).view(1, seq, 1, seq).expand(batch, seq, k.shape[2], seq)
    return masked_attention(q, k, v, mask, SCALE)


@pytest.mark.parametrize("seq,n_q_heads,n_kv_heads,window", [
    (50, 4, 2, 1), (50, 4, 2, 12), (70, 3, 1, 64), (30, 2, 2, 100)])
def test_window_matches_oracle_fp32(seq, n_q_heads, n_kv_heads, window):
    q, k, v, grad_o = attention_inputs(2, seq, n_q_heads, n_kv_heads, head_dim=16)
    o, lse = ops.window_attention_with_lse(q, k, v, window, SCALE)
    o_ref, lse_ref = _window_reference(q, k, v, window)
    assert_close([o, lse], [o_ref, lse_ref])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


def _compressed_reference(q, k_cmp, v_cmp, cfg):
    batch, seq = q.shape[:2]
    n_cmp = k_cmp.shape[1]
    visible = compressed_visibility(seq, cfg).view(1, seq, 1, n_cmp)
    return masked_attention(q, k_cmp, v_cmp, visible.expand(batch, seq, k_cmp.shape[2], n_cmp),
                            SCALE)


@pytest.mark.parametrize("seq,block_len,stride", [(50, 8, 4), (70, 16, 16), (40, 32, 8), (6, 8, 4)])
def test_compressed_matches_oracle_fp32(seq, block_len, stride):
    cfg = tiny_config(l=block_len, d=stride, l_sel=max(16, block_len))
    n_cmp = num_compressed(seq, cfg)
    q, k, v, grad_o = attention_inputs(2, seq, 4, 2, n_keys=n_cmp, head_dim=16)
    o, lse = ops.compressed_attention(q, k, v, block_len, stride, SCALE)
    o_ref, lse_ref = _compressed_reference(q, k, v, cfg)
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen)
    assert_close([o, lse[seen]], [o_ref, lse_ref[seen]])
    assert_close(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v))


def test_band_kernels_with_unmasked_tiles_and_dkdv_items_match_oracle(monkeypatch):
    from nsa.ops.triton import band

    # seq 400: compressed query tiles from t0 = 320 see 64 whole keys, window 200 holds whole
    # key tiles, so both run their unmasked paths; items of two query tiles cut each
    # compressed key tile's queries into several partials, the last one short
    monkeypatch.setattr(band, "ITEM_QUERIES", 128)
    cfg = tiny_config(l=8, d=4, l_sel=16)
    seq = 400
    n_cmp = num_compressed(seq, cfg)
    q, k, v, grad_o = attention_inputs(1, seq, 4, 2, n_keys=n_cmp, head_dim=16)
    assert band.key_items(band.COMPRESSED, seq) == 4
    o, _ = ops.compressed_attention(q, k, v, 8, 4, SCALE)
    o_ref, _ = _compressed_reference(q, k, v, cfg)
    split = grads_of(o, grad_o, q, k, v)
    assert_close([o, *split], [o_ref, *grads_of(o_ref, grad_o, q, k, v)])
    again = grads_of(ops.compressed_attention(q, k, v, 8, 4, SCALE)[0], grad_o, q, k, v)
    assert all(torch.equal(a, b) for a, b in zip(split, again, strict=True))
    q, k, v, grad_o = attention_inputs(1, seq, 4, 2, head_dim=16)
    o, lse = ops.window_attention_with_lse(q, k, v, 200, SCALE)
    o_ref, lse_ref = _window_reference(q, k, v, 200)
    assert_close([o, lse, *grads_of(o, grad_o, q, k, v)],
                 [o_ref, lse_ref, *grads_of(o_ref, grad_o, q, k, v)])


def test_key_items_cut_compressed_keys_and_never_the_window():
    from nsa.ops.triton import band

    assert band.key_items(band.WINDOW, 65536) == 1
    assert band.key_items(band.COMPRESSED, 65536) == 65536 // band.ITEM_QUERIES
    assert band.key_items(band.COMPRESSED, band.ITEM_QUERIES) == 1
    assert band.key_items(band.COMPRESSED, band.ITEM_QUERIES + 1) == 2


@pytest.mark.parametrize("n_q_heads,n_kv_heads,l,d,l_sel,seq", [
    (4, 2, 8, 4, 16, 70), (16, 1, 32, 16, 64, 300), (6, 2, 16, 8, 32, 150),
    (2, 2, 16, 16, 16, 90), (4, 2, 32, 16, 64, 20)])  # the last: no compressed token yet
def test_block_score_kernel_selects_what_the_torch_selection_selects(n_q_heads, n_kv_heads, l,
                                                                     d, l_sel, seq):
    from nsa.ops.selection import group_block_scores, select_blocks
    from nsa.ops.torch import compressed_attention

    cfg = tiny_config(n_heads=n_q_heads, n_kv_heads=n_kv_heads, head_dim=16, l=l, d=d,
                      l_sel=l_sel, n_sel=4, w=32)
    n_cmp = num_compressed(seq, cfg)
    q, k, v, _ = attention_inputs(2, seq, n_q_heads, n_kv_heads, n_keys=n_cmp, head_dim=16)
    _, lse = compressed_attention(q, k, v, l, d, SCALE)
    n_blocks = -(-seq // l_sel)
    group = n_q_heads // n_kv_heads
    logits = torch.einsum("bskgd,bnkd->bskgn", q.view(2, seq, n_kv_heads, group, 16), k) * SCALE
    visible = torch.arange(n_cmp) * d + l - 1 <= torch.arange(seq).view(-1, 1)
    logits = logits.masked_fill(~visible.view(1, seq, 1, 1, n_cmp), float("-inf"))
    want = group_block_scores(torch.softmax(logits, -1).nan_to_num(0.0).sum(3), n_blocks, cfg)
    for given_lse in (lse, None):  # from the compressed branch, or computed by the kernel
        got = ops.block_scores(q, k, given_lse, 0, seq, n_blocks, l, d, l_sel, SCALE)
        assert_close([got], [want])
        tail = ops.block_scores(q, k, given_lse, 7, seq - 7, n_blocks, l, d, l_sel, SCALE)
        assert_close([tail], [want[:, 7:]])
        assert torch.equal(ops.select_blocks(q, k, given_lse, cfg, SCALE),
                           select_blocks(q, k, cfg, SCALE))


@pytest.mark.parametrize("n_q_heads,n_kv_heads,l,d,l_sel,n_sel,seq,batch", [
    (4, 2, 8, 4, 16, 3, 300, 2), (16, 1, 32, 16, 64, 4, 300, 1), (6, 2, 16, 8, 32, 5, 150, 2),
    (2, 2, 16, 16, 16, 4, 90, 2), (4, 2, 32, 16, 64, 3, 20, 2), (8, 1, 8, 4, 16, 16, 400, 1)])
def test_compressed_and_selection_kernel_matches_oracle_and_torch_selection(
        n_q_heads, n_kv_heads, l, d, l_sel, n_sel, seq, batch):
    """One kernel computes the compressed branch (o, lse and gradients against the oracle)
    and the selected blocks (exactly the torch selection's indices), with tiles that every
    query sees whole (unmasked) and tiles at the edge of visibility."""
    from nsa.ops.selection import select_blocks

    cfg = tiny_config(n_heads=n_q_heads, n_kv_heads=n_kv_heads, head_dim=16, l=l, d=d,
                      l_sel=l_sel, n_sel=n_sel, w=32)
    n_cmp = num_compressed(seq, cfg)
    # the largest shapes with one sequence: the interpreter's time grows with the grid, and
    # the cases with two cover the batch stride
    q, k, v, grad_o = attention_inputs(batch, seq, n_q_heads, n_kv_heads, n_keys=n_cmp,
                                       head_dim=16)
    o, lse, indices = ops.compressed_attention_and_selection(q, k, v, cfg, SCALE)
    o_ref, lse_ref = _compressed_reference(q, k, v, cfg)
    seen = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), seen)
    assert_close([o, lse[seen]], [o_ref, lse_ref[seen]])
    # dK/dV sum over G heads and every later query (up to ~40 for G = 16 here): 1e-5 of the
    # gradient's largest entry, at least 1e-5
    for got, want in zip(grads_of(o, grad_o, q, k, v), grads_of(o_ref, grad_o, q, k, v),
                         strict=True):
        assert_close([got], [want], tol=TOL * max(1.0, want.abs().amax().item()
                                                  if want.numel() else 1.0))
    assert torch.equal(indices, select_blocks(q, k, cfg, SCALE))
    assert indices.requires_grad is False


def test_band_kernels_fp16_and_deterministic():
    q, k, v, grad_o = attention_inputs(1, 60, 4, 2, head_dim=32)
    low = [t.detach().half().requires_grad_() for t in (q, k, v)]
    o, _ = ops.window_attention_with_lse(*low, 20, SCALE)
    o_ref, _ = _window_reference(q, k, v, 20)
    first = list(torch.autograd.grad(o, low, grad_o.half(), retain_graph=True))
    _assert_fp16_close([o, *first], [o_ref, *grads_of(o_ref, grad_o, q, k, v)])
    again = grads_of(o, grad_o.half(), *low)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize("branches", [("cmp", "sel", "win"), ("sel",)], ids="+".join)
def test_layer_on_triton_matches_naive_backend(branches):
    cfg = tiny_config(head_dim=16, branches=branches, backend="triton", n_sel=4)
    fast = NSAAttention(cfg)
    slow = NSAAttention(cfg.replace(backend="naive"))
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(1, 45, cfg.dim, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    grad = torch.randn(1, 45, cfg.dim)
    out, out_ref = fast(x), slow(x2)
    out.backward(grad)
    out_ref.backward(grad)
    assert fast.backend_used == "triton"
    assert_close([out, x.grad], [out_ref, x2.grad])
    for (name, p), (_, p_ref) in zip(fast.named_parameters(), slow.named_parameters(),
                                     strict=True):
        assert (p.grad is None) == (p_ref.grad is None), name
        if p.grad is not None:
            assert_close([p.grad], [p_ref.grad])


@pytest.mark.parametrize("n_branches", [1, 2, 3])
def test_gated_sum_kernel_matches_the_torch_gated_sum(n_branches):
    from nsa.ops.mix import gated_sum

    outputs = [torch.randn(2, 37, 3, 16, requires_grad=True) for _ in range(n_branches)]
    gates = [torch.rand(2, 37, 3, requires_grad=True) for _ in range(n_branches)]
    want = gated_sum(outputs, gates)
    grad = torch.randn_like(want)
    got = ops.gated_sum(outputs, torch.stack(gates, -1))
    assert_close([got, *torch.autograd.grad(got, outputs + gates, grad)],
                 [want, *torch.autograd.grad(want, outputs + gates, grad)])
    with pytest.raises(ValueError, match="gated_sum: need 1 to 3 outputs"):
        ops.gated_sum(outputs, torch.stack(gates, -1)[..., :1].expand(2, 37, 3, 5))


def test_auto_runs_torch_on_cpu_even_with_the_interpreter():
    layer = NSAAttention(tiny_config(head_dim=16, backend="auto"))
    layer(torch.randn(1, 20, layer.cfg.dim))
    assert layer.backend_used == "torch"


def test_unsupported_shapes_name_the_limit():
    assert "head_dim 48" in unsupported_reason(48, 16)
    assert "head_dim 256" in unsupported_reason(256, 64)
    assert "l_sel 24" in unsupported_reason(64, 24)
    assert "l_sel 256" in unsupported_reason(64, 256)
    assert unsupported_reason(128, 64) is None
    with pytest.raises(ValueError, match="head_dim 8 is not supported by the triton backend"):
        NSAAttention(tiny_config(head_dim=8, backend="triton"))


def test_auto_routes_to_torch_when_triton_cannot_be_imported(monkeypatch):
    import nsa.layer

    broken = "backend triton: cannot import triton (ImportError: libcuda.so.1: not found)"
    monkeypatch.setattr(nsa.layer, "_triton_import_error", lambda: broken)
    cfg = tiny_config(head_dim=16, backend="auto")
    assert nsa.layer.resolve_backend(cfg, torch.device("cuda")) == ("torch", broken)
    with pytest.raises(ValueError, match="cannot import triton"):
        nsa.layer.resolve_backend(cfg.replace(backend="triton"), torch.device("cuda"))


def test_triton_on_cpu_without_interpreter_is_one_clear_error():
    code = ("import torch; from nsa.config import NSAConfig; from nsa.layer import NSAAttention"
            "\ntry:\n    NSAAttention(NSAConfig(dim=32, n_heads=2, n_kv_heads=1, head_dim=16, "
            "backend='triton'))(torch.randn(1, 20, 32))\nexcept ValueError as e:\n    print(e)")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("the triton backend needs a CUDA device, got cpu "
                                  "(use backend torch or auto)")
