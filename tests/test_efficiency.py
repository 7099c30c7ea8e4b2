"""Slow by size or by defect (nsadiag.probes.efficiency): what one forward dispatches, on
hand-made measurements and on real tiny models (counts only: no timing is asserted)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from nsadiag.probes.efficiency import (
    WorkCount,
    count_work,
    dense_reference,
    matmul_rate,
    slow_by,
)


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
