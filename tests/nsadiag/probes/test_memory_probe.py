"""Saved-for-backward accounting per module and per NSA branch."""

import json

import pytest
import torch

from nsa.model import NSATransformer
from nsadiag.probes.memory import SavedTensorLedger, cuda_allocator_stats
from tests.helpers import nsadiag, tiny_config


def _attention_bytes(backend: str, seq: int) -> tuple[int, dict]:
    model = NSATransformer(tiny_config(backend=backend, n_layers=1, n_sel=4, w=32)).train()
    ids = torch.randint(0, 64, (1, seq + 1))
    with SavedTensorLedger(model) as ledger:
        model.loss(ids)
    attn = sum(n for name, n in ledger.by_module().items() if name.startswith("blocks.0.attn"))
    return attn, ledger.by_branch()


@pytest.mark.parametrize("backend,low,high", [("naive", 3.5, 4.5), ("torch", 1.8, 2.2)])
def test_attention_saved_bytes_grow_quadratically_on_the_oracle_linearly_on_torch(
        backend, low, high):
    small, _ = _attention_bytes(backend, 256)
    large, _ = _attention_bytes(backend, 512)
    assert low <= large / small <= high


def test_saved_bytes_are_attributed_to_each_branch():
    _, branches = _attention_bytes("torch", 256)
    assert set(branches) >= {"cmp", "sel", "win"}
    assert all(branches[b] > 0 for b in ("cmp", "sel", "win"))


def test_views_and_parameters_are_not_counted_twice():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with SavedTensorLedger(lin) as ledger:
        y = lin(x)
        (y[:2] * y[2:]).sum()  # two views of one storage are saved by mul
    assert ledger.total == x.numel() * 4 + y.numel() * 4  # x (by the Linear) + y's storage


def test_allocator_stats_degrade_on_cpu():
    assert cuda_allocator_stats(torch.device("cpu")) == \
        "CUDA allocator statistics: not available on this device"


def test_memory_command_reports_branches_as_json():
    done = nsadiag("memory", "--layers", "1", "--seq-len", "256", "--steps", "1", "--json",
                   "--set", "dim=64", "--set", "n_heads=4", "--set", "n_kv_heads=2",
                   "--set", "head_dim=16", "--set", "w=64")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["saved_total"] == sum(summary["saved_by_module"].values())
    assert set(summary["saved_by_branch"]) >= {"cmp", "sel", "win"}
    assert summary["cuda"].startswith("CUDA allocator statistics: not available")
