"""Slow by size or by defect (nsadiag.probes.efficiency counts, nsadiag.verdict.size_or_defect
reads the counts): what one forward dispatches, on hand-made measurements and on real tiny
models (counts only: no timing is asserted)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from nsadiag.probes.efficiency import WorkCount, count_work, dense_reference, matmul_rate
from nsadiag.verdict.size_or_defect import slow_by


def test_a_host_read_per_token_and_tiny_ops_are_a_defect():
    measured = {"efficiency": 0.007, "dense_efficiency": 0.7, "flops_per_op": 2_000.0,
                "dense_flops_per_op": 500_000.0, "host_reads_per_step": 512}
    verdict, findings = slow_by(measured, seq_len=256)
    assert verdict == "defect"
    assert findings == [
        "512 host reads (.item(), .tolist()) per step for 256 tokens: a read per token",
        "2,000 FLOP per op where a dense block's ops average 500,000: a loop issuing tiny ops"]


def test_large_ops_without_per_token_reads_are_slow_by_size_whatever_the_efficiency():
    # a healthy sparse model at tiny widths: a tenth of the dense efficiency, but its ops
    # are a twentieth of a dense block's at worst and it reads the host a few times
    measured = {"efficiency": 0.02, "dense_efficiency": 0.22, "flops_per_op": 33_000.0,
                "dense_flops_per_op": 519_000.0, "host_reads_per_step": 32}
    assert slow_by(measured, seq_len=256) == ("size", [])
    assert slow_by({**measured, "host_reads_per_step": 40}, seq_len=64) == ("size", [])
    assert slow_by({"efficiency": None}, seq_len=64) == (None, [])


def test_tiny_ops_are_a_defect_only_when_issued_per_token_and_block():
    # the built-in NSA at width 32 and S = 2048: its ops are a hundredth of dense
    # attention's, but it issues 87 compute ops per block for 2048 tokens
    sparse = {"flops_per_op": 239_119.0, "dense_flops_per_op": 19_573_419.0,
              "host_reads_per_step": 0, "compute_ops_per_step": 87, "blocks": 1}
    assert slow_by(sparse, seq_len=2048) == ("size", [])
    assert slow_by({**sparse, "compute_ops_per_step": 1033, "blocks": 12},
                   seq_len=2048) == ("size", [])
    # a loop over the tokens: two matmuls per token in one block
    loop = {**sparse, "compute_ops_per_step": 4101}
    assert slow_by(loop, seq_len=2048) == ("defect", [
        "239,119 FLOP per op where a dense block's ops average 19,573,419, and 4,101 compute "
        "ops (matmuls, attention) in one forward for 2048 tokens and 1 block(s): a loop "
        "issuing per-token ops"])
    # many per-token ops of a normal size are no loop of tiny ops
    assert slow_by({**loop, "flops_per_op": 1_000_000.0}, seq_len=2048) == ("size", [])
    # a short sequence's few ops are not per token
    assert slow_by({**loop, "compute_ops_per_step": 40}, seq_len=16) == ("size", [])


class _PerToken(nn.Module):
    def forward(self, x):
        rows = []
        for t in range(x.shape[1]):
            score = x[:, t] @ x[:, : t + 1].transpose(-1, -2)
            if score.abs().max().item() > 1e9:
                score = score.clamp(-1e9, 1e9)
            rows.append(score.sum(-1, keepdim=True))
        return torch.cat(rows, dim=1)


def test_count_work_counts_host_reads_ops_and_cpu_attention_flops():
    x = torch.randn(1, 32, 16)
    with count_work() as loop:
        _PerToken()(x)
    assert loop.host_reads == 32 and loop.ops > 32 * 4
    assert loop.compute_ops == 32  # one matmul per token; the reads are no compute
    q = torch.randn(1, 2, 128, 16)
    with count_work() as attention:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    # QK^T and PV over the full 128 x 128 scores: 2 x (2 * 2 * 128 * 128 * 16)
    assert attention.flops == 2 * 2 * 2 * 128 * 128 * 16
    into = WorkCount()
    with count_work(into):
        torch.randn(4, 4) @ torch.randn(4, 4)
    assert into.flops == 2 * 4 * 4 * 4 and into.flops_per_op() == into.flops / into.ops


def test_the_dense_reference_counts_three_forwards_of_flops_per_step():
    found = dense_reference(1, 64, 64, torch.device("cpu"), torch.float32)
    with count_work() as forward:
        nn.Linear(64, 192)(torch.randn(1, 64, 64))
    assert found["flops"] > 3 * forward.flops  # more than its first projection alone
    assert found["flops"] % 3 == 0 and found["flops_per_op"] > 0
    assert found["efficiency"] > 0
    # measured against the best matmul reading so far, the one trials then report
    rate = found["machine_flops_per_s"]
    assert rate == matmul_rate(torch.device("cpu"), torch.float32)
    assert found["efficiency"] == pytest.approx(found["flops"] / found["seconds"] / rate)


def test_the_built_in_nsa_issues_far_fewer_compute_ops_than_tokens_per_block():
    from nsa.config import NSAConfig
    from nsa.model import NSATransformer

    config = NSAConfig(dim=32, n_heads=4, n_kv_heads=2, head_dim=8, l=8, d=4, l_sel=16,
                       n_sel=3, w=16, n_layers=2)
    for seq_len in (256, 2048):
        with count_work() as nsa:
            NSATransformer(config)(torch.randint(0, 256, (2, seq_len)))
        assert 0 < nsa.compute_ops < 0.5 * seq_len * config.n_layers, (seq_len, nsa)
        measured = {"flops_per_op": 3 * nsa.flops / nsa.ops, "dense_flops_per_op": 1e12,
                    "host_reads_per_step": nsa.host_reads,
                    "compute_ops_per_step": nsa.compute_ops, "blocks": config.n_layers}
        assert slow_by(measured, seq_len) == ("size", [])
