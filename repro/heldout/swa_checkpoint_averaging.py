"""Trains a wide five-layer MLP (2560-unit Linear layers, about 21M parameters,
~84 MB of float32 weights) and, for stochastic-weight-averaging later,
appends a full copy.deepcopy(model.state_dict()) to the in-memory list
`snapshots` after every optimizer step ("keep every checkpoint, average at
the end"). The script first caps its own address space at 3 GiB with
resource.setrlimit(resource.RLIMIT_AS, ...), as it does on the shared
training box. The defect is unbounded memory growth: nothing is ever dropped
from `snapshots`, so memory grows by ~84 MB per step, and after about twenty
steps (a few seconds) the next allocation fails - wherever it happens to be,
typically in loss.backward() or in the deepcopy - and the process exits with
torch's "DefaultCPUAllocator: can't allocate memory" RuntimeError (or a
Python MemoryError): it has run out of memory.

Expected verdict: OOM
Run: nsadiag run -- python repro/heldout/swa_checkpoint_averaging.py
Cause words: snapshots | deepcopy | state_dict | memory growth | RLIMIT_AS
Next words: running average | torch.optim.swa_utils.AveragedModel | keep only the last few | save to disk | average in place
"""
import copy
import resource

import torch
import torch.nn as nn

MEM_CAP = 3 * 1024 ** 3
HIDDEN = 2560


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (MEM_CAP, hard))
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(512, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, 10),
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model has {n_params / 1e6:.1f}M parameters", flush=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    snapshots = []
    for step in range(1000):
        x = torch.randn(64, 512)
        y = torch.randint(0, 10, (64,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        snapshots.append(copy.deepcopy(model.state_dict()))
        print(f"step {step} loss {loss.item():.4f} snapshots {len(snapshots)}", flush=True)

    averaged = {k: torch.stack([s[k] for s in snapshots]).mean(0) for k in snapshots[0]}
    model.load_state_dict(averaged)
    print("averaged", len(snapshots), "checkpoints")


if __name__ == "__main__":
    main()
