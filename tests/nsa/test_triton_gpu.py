"""The compiled Triton kernels on a CUDA GPU: bf16 at realistic shapes against the torch
backend in fp32, determinism, and routing of backend="auto". Skipped without CUDA."""

import math

import pytest
import torch

from nsa.config import NSAConfig
from nsa.layer import NSAAttention
from nsa.ops import torch as torch_ops
from nsa.ops.selection import select_blocks

ops = pytest.importorskip("nsa.ops.triton.ops")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or ops.INTERPRETED,
                                 reason="needs a CUDA GPU and compiled (not interpreted) kernels")]

BF16_TOL = 3e-2  # of the fp32 result's scale


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def _inputs(seq, n_q_heads, n_kv_heads, head_dim, n_keys=None):
    gen = torch.Generator(device="cuda").manual_seed(0)
    n_keys = seq if n_keys is None else n_keys
    make = lambda *shape: torch.randn(*shape, device="cuda", generator=gen)  # noqa: E731
    return (make(1, seq, n_q_heads, head_dim), make(1, n_keys, n_kv_heads, head_dim),
            make(1, n_keys, n_kv_heads, head_dim), make(1, seq, n_q_heads, head_dim))


def _compare(run_fast, run_ref, tensors, grad_o, dtype=torch.bfloat16, tol=BF16_TOL):
    fast = [t.detach().to(dtype).requires_grad_() for t in tensors]
    ref = [t.detach().requires_grad_() for t in tensors]
    o = run_fast(*fast)
    o_ref = run_ref(*ref)
    grads = torch.autograd.grad(o, fast, grad_o.to(dtype))
    grads_ref = torch.autograd.grad(o_ref, ref, grad_o)
    for got, want in zip([o, *grads], [o_ref, *grads_ref], strict=True):
        assert _rel_err(got, want) <= tol


@pytest.mark.parametrize("seq,head_dim", [(2048, 128), (8192, 64)])
def test_selected_bf16_matches_torch_fp32(seq, head_dim):
    cfg = NSAConfig(n_heads=16, n_kv_heads=1, head_dim=head_dim)
    q, k, v, grad_o = _inputs(seq, 16, 1, head_dim)
    k_cmp = torch.randn(1, (seq - cfg.l) // cfg.d + 1, 1, head_dim, device="cuda")
    idx = select_blocks(q, k_cmp, cfg)
    scale = 1 / math.sqrt(head_dim)
    _compare(lambda q, k, v: ops.selected_attention(q, k, v, idx, cfg.l_sel, scale),
             lambda q, k, v: torch_ops.selected_attention(q, k, v, idx, cfg.l_sel, scale),
             (q, k, v), grad_o)


@pytest.mark.parametrize("seq", [2048, 8192])
def test_band_kernels_bf16_match_torch_fp32(seq):
    q, k, v, grad_o = _inputs(seq, 8, 2, 128)
    _compare(lambda q, k, v: ops.window_attention_with_lse(q, k, v, 512, 0.1)[0],
             lambda q, k, v: torch_ops.window_attention(q, k, v, 512, 0.1), (q, k, v), grad_o)
    n_cmp = (seq - 32) // 16 + 1
    q, k, v, grad_o = _inputs(seq, 8, 2, 128, n_keys=n_cmp)
    _compare(lambda q, k, v: ops.compressed_attention(q, k, v, 32, 16, 0.1)[0],
             lambda q, k, v: torch_ops.compressed_attention(q, k, v, 32, 16, 0.1)[0],
             (q, k, v), grad_o)


@pytest.mark.parametrize("seq,head_dim,group", [(8192, 128, 16), (4096, 64, 4)])
def test_compressed_and_selection_kernel_matches_torch(seq, head_dim, group):
    """The fused kernel: the compressed branch in bf16 against the torch backend in fp32,
    and the selected blocks against the torch selection on the same inputs: rows may differ
    only where two blocks' scores tie to within the two summation orders' rounding (fp32:
    at most 1 row in 1000; bf16 inputs, whose exponentials differ more: 1 in 100)."""
    cfg = NSAConfig(n_heads=group * 2, n_kv_heads=2, head_dim=head_dim)
    n_cmp = (seq - cfg.l) // cfg.d + 1
    q, k, v, grad_o = _inputs(seq, group * 2, 2, head_dim, n_keys=n_cmp)
    scale = 1 / math.sqrt(head_dim)
    _compare(lambda q, k, v: ops.compressed_attention_and_selection(q, k, v, cfg, scale)[0],
             lambda q, k, v: torch_ops.compressed_attention(q, k, v, cfg.l, cfg.d, scale)[0],
             (q, k, v), grad_o)
    _, _, fp32_indices = ops.compressed_attention_and_selection(q, k, v, cfg, scale)
    same_rows = (fp32_indices == select_blocks(q, k, cfg, scale)).all(-1).float().mean()
    assert same_rows.item() >= 0.999, same_rows
    low = [t.bfloat16() for t in (q, k, v)]
    _, lse, bf16_indices = ops.compressed_attention_and_selection(*low, cfg, scale)
    want = select_blocks(low[0].float(), low[1].float(), cfg, scale)
    same_rows = (bf16_indices == want).all(-1).float().mean().item()
    assert same_rows >= 0.99, same_rows
    assert torch.equal(ops.select_blocks(*low[:2], lse, cfg, scale), bf16_indices)
    assert torch.equal(ops.select_blocks(*low[:2], None, cfg, scale), bf16_indices)


def test_compressed_dkdv_items_and_unmasked_tiles_match_torch():
    # 12k queries: each compressed key tile's queries span three dK/dV work items
    seq = 12288
    q, k, v, grad_o = _inputs(seq, 16, 2, 128, n_keys=(seq - 32) // 16 + 1)
    _compare(lambda q, k, v: ops.compressed_attention(q, k, v, 32, 16, 0.1)[0],
             lambda q, k, v: torch_ops.compressed_attention(q, k, v, 32, 16, 0.1)[0],
             (q, k, v), grad_o)


def test_fp32_kernels_match_torch_at_head_dim_128():
    cfg = NSAConfig(n_heads=16, n_kv_heads=2, head_dim=128, l_sel=128)
    q, k, v, grad_o = _inputs(2048, 16, 2, 128)
    k_cmp = torch.randn(1, (2048 - cfg.l) // cfg.d + 1, 2, 128, device="cuda")
    idx = select_blocks(q, k_cmp, cfg)
    _compare(lambda q, k, v: ops.selected_attention(q, k, v, idx, cfg.l_sel, 0.1),
             lambda q, k, v: torch_ops.selected_attention(q, k, v, idx, cfg.l_sel, 0.1),
             (q, k, v), grad_o, torch.float32, 1e-4)
    _compare(lambda q, k, v: ops.window_attention_with_lse(q, k, v, 512, 0.1)[0],
             lambda q, k, v: torch_ops.window_attention(q, k, v, 512, 0.1), (q, k, v), grad_o,
             torch.float32, 1e-4)


def test_backward_is_bitwise_deterministic():
    cfg = NSAConfig(n_heads=16, n_kv_heads=1, head_dim=64)
    q, k, v, grad_o = _inputs(4096, 16, 1, 64)
    k_cmp = torch.randn(1, (4096 - cfg.l) // cfg.d + 1, 1, 64, device="cuda")
    idx = select_blocks(q, k_cmp, cfg)
    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    o = ops.selected_attention(*leaves, idx, cfg.l_sel, 0.125)
    first = torch.autograd.grad(o, leaves, grad_o.bfloat16(), retain_graph=True)
    second = torch.autograd.grad(o, leaves, grad_o.bfloat16())
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_auto_picks_triton_on_cuda_and_torch_for_an_unsupported_shape():
    layer = NSAAttention(NSAConfig(dim=256, n_heads=4, n_kv_heads=1, head_dim=64)).cuda()
    layer(torch.randn(1, 1024, 256, device="cuda"))
    assert layer.backend_used == "triton"
    odd = NSAAttention(NSAConfig(dim=256, n_heads=4, n_kv_heads=1, head_dim=48)).cuda()
    odd(torch.randn(1, 256, 256, device="cuda"))
    assert odd.backend_used == "torch"


def test_layer_bf16_autocast_trains_on_triton():
    layer = NSAAttention(NSAConfig(dim=512, n_heads=8, n_kv_heads=2, head_dim=64,
                                   backend="triton")).cuda()
    x = torch.randn(1, 4096, 512, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = layer(x)
    out.float().square().mean().backward()
    assert torch.isfinite(x.grad).all() and layer.backend_used == "triton"
