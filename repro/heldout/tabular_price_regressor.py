"""Trains a tabular price regressor (a small MLP over 20 numeric features)
with full-batch-ish steps of B = 6144 rows and a hand-written squared-error
loss in price_loss(), printing progress every step. The defect: the model
returns predictions of shape [B, 1] while the targets have shape [B], so
`pred - target` in price_loss() broadcasts to a [B, B] matrix (about 38M
elements); every step computes and backpropagates through that huge tensor, so
training is very slow (and optimises the wrong objective) but keeps
progressing.

Expected verdict: SLOW
Run: nsadiag run --deadline 30 -- python repro/heldout/tabular_price_regressor.py
Cause words: price_loss | broadcast | pred - target | [B, B]
Next words: squeeze | view(-1) | same shape | mse_loss
"""
import time

import torch
import torch.nn as nn

B = 6144
STEPS = 400


def price_loss(pred, target):
    return ((pred - target) ** 2).mean()


def make_batch(g):
    x = torch.randn(B, 20, generator=g)
    price = 3.0 * x[:, 0] - 2.0 * x[:, 1] + 0.5 * x[:, 2] * x[:, 3]
    return x, price


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    t0 = time.time()
    for step in range(STEPS):
        x, price = make_batch(g)
        pred = model(x)
        loss = price_loss(pred, price)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}/{STEPS} loss={loss.item():.4f} "
              f"elapsed={time.time() - t0:.1f}s", flush=True)
    print("done")


if __name__ == "__main__":
    main()
