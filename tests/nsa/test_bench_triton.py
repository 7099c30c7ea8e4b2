"""bench/bench_triton.py without a GPU: its useful-work count against a brute-force count
from the oracle's masks, its report, and the one-line refusal to run without CUDA."""

import sys

import pytest
import torch

from nsa.config import NSAConfig
from nsa.ops.naive import compressed_visibility, selection_mask, window_mask
from nsa.ops.selection import select_blocks
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
import bench_triton  # noqa: E402


def test_attended_keys_match_the_oracle_masks():
    cfg = NSAConfig(l=8, d=4, l_sel=16, n_sel=3, w=20, head_dim=16, n_heads=4, n_kv_heads=2)
    seq = 70
    q = torch.randn(1, seq, 4, 16)
    k_cmp = torch.randn(1, (seq - cfg.l) // cfg.d + 1, 2, 16)
    idx = select_blocks(q, k_cmp, cfg)
    got = bench_triton.attended_keys(seq, cfg, idx)
    assert got["cmp"] == compressed_visibility(seq, cfg).sum().item()
    assert got["win"] == window_mask(seq, cfg.w).sum().item()
    assert got["sel"] == selection_mask(idx, seq, cfg.l_sel).sum().item() / 2


def test_report_states_targets_and_environment():
    row = dict(seq=65536, head_dim=128, heads=64, kv_heads=4, sel_fwd_ms=3.0, sel_ms=10.0,
               fla_fwd_ms=4.0, fla_ms=12.5, fla_agreement=2e-3, sdpa_kernel_ms=80.0,
               kernel_speedup=8.0, sel_tflops=200.0, sdpa_tflops=400.0,
               sel_fraction_of_dense_tflops=0.5, nsa_layer_fwd_ms=10.0, dense_layer_fwd_ms=90.0,
               nsa_layer_ms=50.0, dense_layer_ms=250.0, layer_speedup=5.0, dense_sdpa="flash")
    parity = [dict(seq=2048, head_dim=128, backend="triton", dtype="bfloat16", out=3.1e-3,
                   dx=4.2e-3, dparams=8.5e-3)]
    env = {"gpu": "H100", "torch": "2.13.0", "triton": "3.7.1", "cuda": "12.8",
           "device": "cuda", "fla": "0.6.0"}
    text = bench_triton.render([row], env, parity)
    assert "GPU: H100" in text and "fla-core 0.6.0" in text
    assert "| 65536 | 128 | 64/4 | 3.00 | 4.00 | 10.00 | 12.50 | 1.25x | 2.0e-03 |" in text
    assert "| 65536 | 128 | 10.00 | 90.00 | 9.00x | 50.0 | 250.0 | 5.00x | flash |" in text
    assert "| 128 | triton | bfloat16 | 3.1e-03 | 4.2e-03 | 8.5e-03 |" in text
    assert "selected vs fla 1.25x (met)" in text and "layer 5.00x (met)" in text
    slower = dict(row, layer_speedup=3.5)
    assert "layer 3.50x (missed)" in bench_triton.render([slower], env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_refuses_to_run_without_cuda(capsys):
    assert bench_triton.main(["--seqs", "8192"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_triton: needs a CUDA GPU") and "\n" not in err
