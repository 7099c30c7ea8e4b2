"""Defect: attention written as a Python loop over tokens, with a host sync per token.

A plain training script (no nsadiag import). Every step finishes, but each costs seq_len
Python iterations and as many `.item()` host reads, so a job timeout shorter than the run
cuts it off while it is still making progress.

Expected verdict: SLOW at the deadline (progressing, with the steps done, the time per step
and the loop named), never a hang:

    nsadiag run --deadline 20 -- python repro/scripts/slow_token_loop.py
"""

import argparse
import math

import torch
from torch import nn


class LoopAttention(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        rows = []
        for t in range(x.shape[1]):  # the defect: one token at a time ...
            scores = q[:, t:t + 1] @ k[:, :t + 1].transpose(1, 2) / math.sqrt(x.shape[-1])
            if scores.abs().max().item() > 1e4:  # ... and a host sync per token
                scores = scores.clamp(-1e4, 1e4)
            rows.append(torch.softmax(scores, dim=-1) @ v[:, :t + 1])
        return x + self.out(torch.cat(rows, dim=1))


class Model(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LoopAttention(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Model(256, 32, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        ids = torch.randint(256, (1, args.seq_len + 1))
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
