"""Defect in the environment: torch.compile's C++ build waits for a compiler that never
answers.

A plain training script (no nsadiag import): a small MLP compiled with torch.compile's
default backend (inductor), which on a CPU generates C++ and builds it with the compiler
named by the `CXX` environment variable. On this site `CXX` points to a compiler wrapper
whose compile server is gone (repro/scripts/cxx_wrapper_waits.sh stands for it): the wrapper
never answers, and the first compiled call waits for it forever, with no CPU used and no
error. The script itself is fine; run with a working compiler it trains.

Expected verdict: DEADLOCK at the first compiled call, the wait chain going through
torch.compile's C++ build to the wrapper's process, and the next step to run that compiler
by hand (or point `CXX` at one that works):

    CXX=repro/scripts/cxx_wrapper_waits.sh nsadiag run -- python repro/scripts/compiled_model_cpu.py
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(200):
        x = torch.randn(32, 64)
        loss = (compiled(x) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
