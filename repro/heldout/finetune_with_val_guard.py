"""Fine-tunes a small regression MLP and evaluates on a held-out split after
every epoch; a validation guard in check_validation() aborts the run if the
validation loss blows up, printing "val loss diverged" and calling
sys.exit(3) so the job scheduler marks the run as failed. The defect: the
learning rate LR = 0.5 is far too high for this model, training diverges in
the first epoch, the guard trips and the process exits with status 3 without
any traceback.

Expected verdict: ERROR
Run: nsadiag run -- python repro/heldout/finetune_with_val_guard.py
Cause words: sys.exit(3) | check_validation | val loss diverged | exit code 3
Next words: exit code 3 | learning rate | sys.exit(3) | val loss diverged
"""
import math
import sys

import torch
import torch.nn as nn

LR = 0.5
MAX_VAL_LOSS = 1e3


def make_split(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g) * 3
    y = (x ** 2).sum(dim=1, keepdim=True)
    return x, y


def check_validation(epoch, val_loss):
    if not math.isfinite(val_loss) or val_loss > MAX_VAL_LOSS:
        print(f"epoch {epoch}: val loss diverged ({val_loss:.3g}), aborting", flush=True)
        sys.exit(3)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    xtr, ytr = make_split(4096, 0)
    xva, yva = make_split(512, 1)
    for epoch in range(20):
        for i in range(0, len(xtr), 128):
            loss = nn.functional.mse_loss(model(xtr[i:i + 128]), ytr[i:i + 128])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(model(xva), yva).item()
        print(f"epoch {epoch} train={loss.item():.4g} val={val_loss:.4g}", flush=True)
        check_validation(epoch, val_loss)
    print("fine-tune complete")


if __name__ == "__main__":
    main()
