"""Selection (Eq.8-11) against brute-force span counting and explicit ranking."""

import pytest
import torch

from nsa.config import num_compressed, num_select_blocks
from nsa.ops import naive, shift
from nsa.ops.selection import group_block_scores, select_blocks, span_block_weights, top_n_blocks
from tests.helpers import tiny_config

SPAN_CONFIGS = [
    dict(l=32, d=16, l_sel=64),  # paper
    dict(l=8, d=4, l_sel=16),
    dict(l=16, d=16, l_sel=16),
    dict(l=8, d=8, l_sel=32),
    dict(l=12, d=4, l_sel=24),
]


def test_paper_overlap_weights_are_1_2_2_2_1():
    cfg = tiny_config(l=32, d=16, l_sel=64)
    first, second = span_block_weights(cfg)
    # the four spans starting in block j weigh 2,2,2,1 inside j; the last one spills 1
    assert [w / cfg.d for w in first] == [2, 2, 2, 1]
    assert [w / cfg.d for w in second] == [0, 0, 0, 1]


@pytest.mark.parametrize("spans", SPAN_CONFIGS)
@pytest.mark.parametrize("seq", [40, 64, 97])
def test_block_scores_equal_brute_force_overlap(spans, seq):
    cfg = tiny_config(n_heads=4, n_kv_heads=2, **spans)
    n_cmp = num_compressed(seq, cfg)
    p = torch.rand(2, seq, cfg.n_heads, n_cmp)
    expected = naive.naive_block_scores(p, cfg)
    p_group = p.view(2, seq, cfg.n_kv_heads, cfg.group_size, n_cmp).sum(3)
    got = group_block_scores(p_group, num_select_blocks(seq, cfg), cfg)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("n_sel", [3, 4, 7])
def test_top_n_matches_explicit_ranking_with_ties(n_sel):
    cfg = tiny_config(n_sel=n_sel)
    seq = 100
    n_blocks = num_select_blocks(seq, cfg)
    scores = torch.randint(-2, 3, (2, seq, cfg.n_kv_heads, n_blocks)).float()  # many ties
    scores[0, :, 0, 1] = -0.0  # equal to 0.0
    got = top_n_blocks(scores, torch.arange(seq), cfg)
    assert torch.equal(got, naive.naive_select(scores, cfg))


def test_ties_go_to_the_lower_block():
    cfg = tiny_config(n_sel=4)
    seq = 16 * 8
    scores = torch.zeros(1, seq, 1, 8)
    got = top_n_blocks(scores, torch.arange(seq), cfg)[0, -1, 0]
    # t = 127: forced 0, 6, 7; the fourth is the lowest-index tie, block 1
    assert got.tolist() == [0, 1, 6, 7]


def _pipeline_inputs(cfg, seq, batch=2):
    q = torch.randn(batch, seq, cfg.n_heads, cfg.head_dim)
    k_cmp = torch.randn(batch, num_compressed(seq, cfg), cfg.n_kv_heads, cfg.head_dim)
    return q, k_cmp


def _naive_indices(q, k_cmp, cfg):
    p = naive.naive_compressed_probs(q, k_cmp, cfg, cfg.head_dim ** -0.5)
    return naive.naive_select(naive.naive_block_scores(p, cfg), cfg)


@pytest.mark.parametrize("exp_bound", [shift.EXP_BOUND, 0.0], ids=["unshifted", "row-max"])
@pytest.mark.parametrize("gqa", [1, 2, 4])
@pytest.mark.parametrize("seq,n_sel", [(37, 3), (70, 4), (100, 16)])
def test_select_blocks_matches_oracle(gqa, seq, n_sel, exp_bound, monkeypatch):
    """Both softmax paths (logits as they are, or shifted by the row maximum when the
    bound of nsa.ops.shift is set to 0) rank exactly as the oracle."""
    monkeypatch.setattr(shift, "EXP_BOUND", exp_bound)
    cfg = tiny_config(n_heads=2 * gqa, n_kv_heads=2, n_sel=n_sel)
    q, k_cmp = _pipeline_inputs(cfg, seq)
    assert shift.unshifted_exp_is_safe(q, k_cmp, cfg.head_dim ** -0.5) is (exp_bound > 0)
    got = select_blocks(q, k_cmp, cfg)
    assert torch.equal(got, _naive_indices(q, k_cmp, cfg))


def test_forced_blocks_causal_and_unique():
    cfg = tiny_config(n_sel=5)
    seq = 150
    q, k_cmp = _pipeline_inputs(cfg, seq)
    idx = select_blocks(q, k_cmp, cfg)
    for t in range(seq):
        local = t // cfg.l_sel
        for h in range(cfg.n_kv_heads):
            row = idx[0, t, h]
            valid = row[row >= 0].tolist()
            assert valid == sorted(set(valid)), "ascending, no duplicate"
            assert len(valid) == min(cfg.n_sel, local + 1)
            assert all(j * cfg.l_sel <= t for j in valid), "a block beyond t"
            assert {0, local, max(local - 1, 0)} <= set(valid)
            assert (row[len(valid):] == -1).all()


def test_heads_of_a_group_select_together():
    """Eq.10: the group's choice is symmetric in its heads (permuting them changes nothing)
    and differs from what a single head alone would pick in general."""
    cfg = tiny_config(n_heads=4, n_kv_heads=1, n_sel=4)
    seq = 160
    q, k_cmp = _pipeline_inputs(cfg, seq, batch=1)
    idx = select_blocks(q, k_cmp, cfg)
    assert torch.equal(idx, select_blocks(q[:, :, [2, 0, 3, 1]], k_cmp, cfg))
    single = select_blocks(q[:, :, :1], k_cmp, cfg.replace(n_heads=1))
    assert not torch.equal(idx, single)


def test_selection_ignores_future_queries_and_keys():
    cfg = tiny_config(n_sel=4)
    seq, t = 96, 50
    q, k_cmp = _pipeline_inputs(cfg, seq, batch=1)
    idx = select_blocks(q, k_cmp, cfg)
    q2, k2 = q.clone(), k_cmp.clone()
    q2[:, t:] = torch.randn_like(q2[:, t:])
    # compressed tokens that end at or after t are invisible to every query < t
    first_late = max(0, (t - cfg.l) // cfg.d + 1)
    k2[:, first_late:] = torch.randn_like(k2[:, first_late:])
    assert torch.equal(select_blocks(q2, k2, cfg)[:, :t], idx[:, :t])


@pytest.mark.parametrize("chunk", [8, 6, 64])
def test_tile_ends_see_their_newest_compressed_token(chunk):
    """Queries at tile ends where (end - l) % d == 0 must score every visible token."""
    cfg = tiny_config(l=4, d=2, l_sel=4, n_sel=5, n_heads=2, n_kv_heads=1, query_chunk=chunk)
    q, k_cmp = _pipeline_inputs(cfg, 64)
    assert torch.equal(select_blocks(q, k_cmp, cfg), _naive_indices(q, k_cmp, cfg))
