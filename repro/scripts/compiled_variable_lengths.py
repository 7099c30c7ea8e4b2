"""Defect: a compiled model fed a new sequence length at every step, compiled for static
shapes, so Dynamo's guards fail and it recompiles at nearly every step.

A plain training script (no nsadiag import). The batches are sentences packed to the
longest one of the batch (no padding to a fixed length), and the model is compiled with
`dynamic=False` for the fastest kernels (with the `aot_eager` backend: the cluster nodes
have no C++ toolchain for inductor), and Dynamo's recompile limit was raised after it
warned that the limit was hit. Every new length fails the shape guard of the
compiled code ("size mismatch at index 1"), and Dynamo compiles again: the run spends its
time in the compiler, not in the model.

Expected verdict: SLOW at the deadline, recompiles: the count of recompiles per step and
the guard that failed; the next step is `dynamic=True` or padding to fixed lengths:

    nsadiag run --deadline 40 -- python repro/scripts/compiled_variable_lengths.py
"""

import random

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + torch.tanh(self.mix(x)).cumsum(dim=1) / ids.shape[1]
        return self.head(x)


def batches(steps: int, batch_size: int):
    rng = random.Random(0)
    for _ in range(steps):
        length = rng.randint(16, 200)  # the longest sentence of the batch
        ids = torch.randint(0, 500, (batch_size, length + 1))
        yield ids[:, :-1], ids[:, 1:]


def main() -> None:
    torch.manual_seed(0)
    model = TinyLM(500, 32)
    torch._dynamo.config.recompile_limit = 512  # it warned "hit config.recompile_limit"
    compiled = torch.compile(model, dynamic=False, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (inputs, targets) in enumerate(batches(1000, 4)):
        logits = compiled(inputs)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} len {inputs.shape[1]} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
