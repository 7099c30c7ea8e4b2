"""RoPE and the gated branch sum: their autograd Functions against the plain formulas, fp32."""

from __future__ import annotations

import pytest
import torch

from nsa.ops.mix import gated_sum
from nsa.ops.rope import apply_rope, rope_tables
from tests.helpers import grads_of

TOL = 1e-5


def _reference_rope(x, cos, sin):
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided-view"])
def test_rope_matches_the_formula_forward_and_backward(strided):
    gen = torch.Generator().manual_seed(0)
    seq, heads, dim = 37, 3, 16
    base = torch.randn(2, seq, heads, 2 * dim if strided else dim, generator=gen)
    leaf = base.requires_grad_()
    x = leaf[..., :dim] if strided else leaf  # a slice, as of a fused projection's output
    cos, sin = rope_tables(seq, dim, 10000.0, x.device, x.dtype)
    grad = torch.randn(2, seq, heads, dim, generator=gen)
    got = apply_rope(x, cos, sin)
    want = _reference_rope(x, cos, sin)
    assert got.is_contiguous()
    assert (got - want).abs().max().item() <= TOL
    (g_got,), (g_want,) = grads_of(got, grad, leaf), grads_of(want, grad, leaf)
    assert (g_got - g_want).abs().max().item() <= TOL
    assert g_got.abs().sum() > 0


def test_rope_position_zero_is_identity_and_norms_are_kept():
    x = torch.randn(1, 9, 2, 8)
    cos, sin = rope_tables(9, 8, 10000.0, x.device, x.dtype)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[:, 0], x[:, 0])
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert not torch.allclose(out[:, 1:], x[:, 1:])


def test_rope_keeps_bf16_and_rejects_an_odd_head_dim():
    x = torch.randn(1, 5, 2, 8, dtype=torch.bfloat16)
    cos, sin = rope_tables(5, 8, 10000.0, x.device, x.dtype)
    assert apply_rope(x, cos, sin).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="head_dim must be even"):
        apply_rope(torch.randn(1, 5, 2, 7), cos, sin)


@pytest.mark.parametrize("n_branches", [1, 2, 3])
def test_gated_sum_matches_the_formula_forward_and_backward(n_branches):
    gen = torch.Generator().manual_seed(n_branches)
    shape = (2, 11, 4, 8)
    outputs = [torch.randn(shape, generator=gen).requires_grad_() for _ in range(n_branches)]
    gates = [torch.rand(shape[:-1], generator=gen).requires_grad_() for _ in range(n_branches)]
    grad = torch.randn(shape, generator=gen)
    got = gated_sum(outputs, gates)
    want = sum(g.unsqueeze(-1) * o for o, g in zip(outputs, gates, strict=True))
    assert (got - want).abs().max().item() <= TOL
    leaves = outputs + gates
    for a, b in zip(grads_of(got, grad, *leaves), grads_of(want, grad, *leaves), strict=True):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= TOL


def test_gated_sum_with_constant_gates_and_bad_shapes():
    outputs = [torch.randn(1, 3, 2, 4, requires_grad=True) for _ in range(2)]
    gates = [torch.rand(1, 3, 2) for _ in range(2)]
    got = gated_sum(outputs, gates)
    (d0,) = torch.autograd.grad(got.sum(), [outputs[0]])
    assert torch.allclose(d0, gates[0].unsqueeze(-1).expand_as(d0))
    with pytest.raises(ValueError, match="one gate per output"):
        gated_sum(outputs, gates[:1])
    with pytest.raises(ValueError, match="gates be"):
        gated_sum(outputs, [torch.rand(1, 3, 2, 4), gates[1]])
