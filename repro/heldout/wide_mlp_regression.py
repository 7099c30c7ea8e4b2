"""Trains a wide four-layer MLP (1024-unit Linear layers) on a synthetic
regression target for 5000 steps with Adam, printing loss.item() every 10
steps. Each step is a few large matmuls, so the run is compute-bound and takes
several minutes on a CPU. There is no defect: the program is healthy and makes
steady progress; it is simply run with a deadline shorter than its total
running time.

Expected verdict: SLOW
Run: nsadiag run --deadline 30 -- python repro/heldout/wide_mlp_regression.py
Cause words: matmul | Linear | compute-bound | addmm
Next words: fewer steps | longer deadline | smaller model | GPU
"""
import time

import torch
import torch.nn as nn

HIDDEN = 1024
BATCH = 512
STEPS = 5000


def make_model():
    return nn.Sequential(
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, 1),
    )


def main():
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    w_true = torch.randn(HIDDEN, 1) / HIDDEN ** 0.5
    t0 = time.time()
    for step in range(STEPS):
        x = torch.randn(BATCH, HIDDEN)
        y = torch.tanh(x @ w_true)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step}/{STEPS} loss={loss.item():.5f} "
                  f"elapsed={time.time() - t0:.1f}s", flush=True)
    print("training complete")


if __name__ == "__main__":
    main()
