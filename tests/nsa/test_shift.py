"""nsa.ops.shift: when logits may be exponentiated without their row maximum."""

import math

import torch

from nsa.ops.shift import EXP_BOUND, EXP_FLOOR, unshifted_exp_is_safe


def _unit(shape: tuple[int, ...]) -> torch.Tensor:
    x = torch.randn(shape)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def test_bound_is_cauchy_schwarz_per_kv_group():
    """scale * |q| * max |k| decides, each query head against the keys of its own kv head
    (a bound over all heads at once would pair group 0's long queries with group 1's long
    keys: 10 times larger here)."""
    q = _unit((1, 5, 4, 8))  # heads 0, 1 read kv head 0; heads 2, 3 read kv head 1
    k = _unit((1, 7, 2, 8))
    q[:, :, :2] *= 10.0
    k[:, :, 0] *= 2.0
    k[:, :, 1] *= 100.0
    scale = EXP_BOUND / 100.0  # group 0: 20 * scale; group 1: 100 * scale = EXP_BOUND
    assert unshifted_exp_is_safe(q, k, scale * 0.999)
    assert not unshifted_exp_is_safe(q, k, scale * 1.001)
    assert unshifted_exp_is_safe(q[:, :, :2], k[:, :, :1], scale * 4.99)
    assert not unshifted_exp_is_safe(q[:, :, :2], k[:, :, :1], scale * 5.01)


def test_no_key_or_no_query_needs_no_shift():
    assert unshifted_exp_is_safe(torch.randn(1, 4, 2, 8), torch.randn(1, 0, 1, 8), 1.0)
    assert unshifted_exp_is_safe(torch.randn(1, 0, 2, 8), torch.randn(1, 4, 1, 8), 1.0)


def test_within_the_bound_exp_stays_normal_and_sums_cannot_overflow():
    """The bound's promise: exp of any logit in [-EXP_BOUND, EXP_BOUND] is a normal fp32
    number, a million of them sum to a finite value, and a lse-shifted logit
    (s - lse >= -2 * EXP_BOUND - log(n keys)) stays above exp's denormal range."""
    edge = torch.tensor([-EXP_BOUND, EXP_BOUND])
    values = edge.exp()
    assert (values >= torch.finfo(torch.float32).tiny).all()
    assert math.isfinite(values[1].item() * 1e6)
    lowest_shifted = -2 * EXP_BOUND - math.log(2 ** 21)
    assert torch.tensor(lowest_shifted).exp() >= torch.finfo(torch.float32).tiny
    assert EXP_FLOOR <= -2 * EXP_BOUND
