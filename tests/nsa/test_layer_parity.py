"""The torch backend of NSAAttention against the dense oracle, fp32, forward and every
gradient (q, k, v of each branch, gates, phi parameters, all layer parameters)."""

import itertools

import pytest
import torch

from nsa.layer import NSAAttention
from nsa.ops.naive import naive_nsa_attention
from tests.helpers import tiny_config

TOL = 1e-5
BRANCH_SETS = [("cmp",), ("sel",), ("win",), ("cmp", "sel", "win")]


def _max_err(a, b):
    return (a - b).abs().max().item()


def _leaf_inputs(layer, x):
    """The layer's projections as fresh leaves, so their gradients can be compared."""
    q, kv, gates = layer.project(x)
    leaf = lambda t: None if t is None else t.detach().clone().requires_grad_(True)  # noqa: E731
    return leaf(q), {b: (leaf(k), leaf(v)) for b, (k, v) in kv.items()}, \
        {b: leaf(g) for b, g in gates.items()}


def _accumulated_grads(tensors):
    return [None if t is None else t.grad for t in tensors]


def _run(fn, q, kv, gates, layer, grad_out):
    for t in [q, *itertools.chain(*kv.values()), *gates.values(), *layer.parameters()]:
        if t is not None:
            t.grad = None
    out = fn(q, kv, gates)
    out.backward(grad_out)
    params = {n: p.grad.clone() for n, p in layer.named_parameters()
              if n.startswith("compress") and p.grad is not None}
    kv_grads = {b: _accumulated_grads(pair) for b, pair in kv.items()}
    return out.detach(), q.grad.clone(), kv_grads, {b: g.grad.clone() for b, g in gates.items()}, \
        params


CASES = [
    # (seq, gqa, shared_kv, n_sel, compressor)
    (37, 1, False, 3, "mlp"),
    (50, 2, False, 3, "mlp"),
    (70, 4, False, 4, "mlp"),
    (70, 2, True, 3, "mlp"),
    (45, 2, False, 8, "mean"),  # n_sel above the 3 available blocks
    (100, 4, True, 5, "mean"),
]


@pytest.mark.parametrize("branches", BRANCH_SETS, ids="+".join)
@pytest.mark.parametrize("seq,gqa,shared,n_sel,compressor", CASES)
def test_branch_ops_match_oracle(branches, seq, gqa, shared, n_sel, compressor):
    cfg = tiny_config(n_heads=2 * gqa, n_kv_heads=2, shared_kv=shared, n_sel=n_sel,
                      compressor=compressor, branches=branches, backend="torch")
    layer = NSAAttention(cfg)
    x = torch.randn(2, seq, cfg.dim)
    q, kv, gates = _leaf_inputs(layer, x)
    grad_out = torch.randn(2, seq, cfg.n_heads, cfg.head_dim)

    def oracle(q, kv, gates):
        return naive_nsa_attention(q, kv, gates, layer.compress_k, layer.compress_v, cfg)[0]

    expected = _run(oracle, q, kv, gates, layer, grad_out)
    got = _run(lambda q, kv, gates: layer._tiled_attention(q, kv, gates, "torch"), q, kv, gates,
               layer, grad_out)
    assert _max_err(got[0], expected[0]) <= TOL, "output"
    assert _max_err(got[1], expected[1]) <= TOL, "dq"
    for branch in kv:
        for name, g, e in zip(("dk", "dv"), got[2][branch], expected[2][branch], strict=True):
            assert (g is None) == (e is None), (branch, name)
            if e is not None:
                assert _max_err(g, e) <= TOL, (branch, name)
    for branch in gates:
        assert _max_err(got[3][branch], expected[3][branch]) <= TOL, ("gate", branch)
    assert got[4].keys() == expected[4].keys()
    if compressor == "mlp" and ("cmp" in branches):
        assert {"compress_k.fc1.weight", "compress_v.pos_emb"} <= set(expected[4])
    for name in expected[4]:
        assert _max_err(got[4][name], expected[4][name]) <= TOL, name


def test_long_sequence_crosses_the_selected_paths():
    """S = 300 with l_sel = 16, n_sel = 4: queries before t = 128 take the selected op's dense
    path, later ones its sparse tiles; the window branch spans many CPU tiles."""
    from nsa.ops.torch import selected

    cfg = tiny_config(n_heads=4, n_kv_heads=2, n_sel=4, w=40, query_chunk=64, backend="torch")
    assert 0 < selected.DENSE_FACTOR * cfg.n_sel * cfg.l_sel < 300
    layer = NSAAttention(cfg)
    x = torch.randn(2, 300, cfg.dim)
    q, kv, gates = _leaf_inputs(layer, x)
    # phi's parameter gradients sum over all 2 x 300 positions; a small upstream gradient
    # keeps them near 1, where fp32 rounding stays well below the 1e-5 tolerance
    grad_out = 0.1 * torch.randn(2, 300, cfg.n_heads, cfg.head_dim)

    def oracle(q, kv, gates):
        return naive_nsa_attention(q, kv, gates, layer.compress_k, layer.compress_v, cfg)[0]

    expected = _run(oracle, q, kv, gates, layer, grad_out)
    got = _run(lambda q, kv, gates: layer._tiled_attention(q, kv, gates, "torch"), q, kv, gates,
               layer, grad_out)
    assert max(g.abs().max().item() for g in expected[4].values()) > 1.0
    assert _max_err(got[0], expected[0]) <= TOL, "output"
    assert _max_err(got[1], expected[1]) <= TOL, "dq"
    for branch in kv:
        for g, e in zip(got[2][branch], expected[2][branch], strict=True):
            assert _max_err(g, e) <= TOL, branch
    for name in expected[4]:
        assert _max_err(got[4][name], expected[4][name]) <= TOL, name


@pytest.mark.parametrize("branches", BRANCH_SETS, ids="+".join)
def test_whole_layer_matches_naive_backend(branches):
    cfg = tiny_config(branches=branches, backend="torch", n_sel=4)
    fast = NSAAttention(cfg)
    slow = NSAAttention(cfg.replace(backend="naive"))
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 61, cfg.dim, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    grad = torch.randn(2, 61, cfg.dim)
    fast(x).backward(grad)
    slow(x2).backward(grad)
    assert _max_err(fast(x), slow(x2)) <= TOL
    assert _max_err(x.grad, x2.grad) <= TOL
    for (name, p), p2 in zip(fast.named_parameters(), slow.parameters(), strict=True):
        # selection is not differentiable: with "sel" alone phi_k receives no gradient
        assert (p.grad is None) == (p2.grad is None) == (branches == ("sel",)
                                                         and name.startswith("compress_k")), name
        if p.grad is not None:
            assert _max_err(p.grad, p2.grad) <= TOL, name
    assert fast.backend_used == "torch" and slow.backend_used == "naive"


def test_branch_subset_builds_and_computes_only_that_branch():
    cfg = tiny_config(branches=("win",))
    layer = NSAAttention(cfg)
    assert layer.compress_k is None and layer.compress_v is None
    assert layer.gate_proj.out_features == cfg.n_heads
    sel_only = NSAAttention(cfg.replace(branches=("sel",)))
    # selection scores compressed keys but never needs compressed values
    assert sel_only.compress_k is not None and sel_only.compress_v is None
    assert [p for p, _ in sel_only.kv_pieces] == ["sel", "sel", "cmp"]


def test_empty_compressed_branch_is_zero_not_nan():
    cfg = tiny_config(branches=("cmp",))
    layer = NSAAttention(cfg)
    x = torch.randn(1, cfg.l - 1, cfg.dim, requires_grad=True)
    out = layer(x)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def _saved_bytes(layer, seq):
    """Bytes the layer's forward leaves saved for backward (parameters excluded)."""
    params = {p.data_ptr() for p in layer.parameters()}
    total = 0

    def pack(t):
        nonlocal total
        if t.data_ptr() not in params:
            total += t.numel() * t.element_size()
        return t

    x = torch.randn(1, seq, layer.cfg.dim, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return total


@pytest.mark.parametrize("backend,low,high", [("torch", 1.8, 2.2), ("naive", 3.5, 4.5)])
def test_saved_for_backward_memory_is_linear_in_s(backend, low, high):
    """The torch backend keeps O(S*(D + n_sel)) per layer; the O(S^2) oracle is the control."""
    cfg = tiny_config(backend=backend, n_sel=4, w=32)
    layer = NSAAttention(cfg)
    ratio = _saved_bytes(layer, 512) / _saved_bytes(layer, 256)
    assert low <= ratio <= high, ratio
