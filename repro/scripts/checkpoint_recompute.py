"""Defect: activation checkpointing around a block whose forward is expensive for reasons
that have no gradient, so the backward spends most of its time recomputing it.

A plain training script (no nsadiag import). Each block routes every token to its nearest
prototypes (a distance matrix and a sort, under `no_grad`: routing has no gradient), then
mixes the routed prototypes in. Memory was tight, so every block is wrapped in
`torch.utils.checkpoint`: the backward reruns each block's forward, the routing with it,
and the recompute costs more than the gradients themselves.

Expected verdict: SLOW at the deadline, checkpoint recompute: the share of the backward
spent rerunning forwards; the next step is to checkpoint less (or keep the routing out of
the checkpointed function), never per-token advice:

    nsadiag run --deadline 20 -- python repro/scripts/checkpoint_recompute.py
"""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class RoutedBlock(nn.Module):
    def __init__(self, dim: int, prototypes: int):
        super().__init__()
        self.prototypes = nn.Parameter(torch.randn(prototypes, dim))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # routing: which prototypes each token is nearest to
            distances = torch.cdist(x, self.prototypes.expand(x.shape[0], -1, -1))
            order = distances.argsort(dim=-1)[..., :4]
        routed = self.prototypes[order].mean(dim=-2)
        return x + self.proj(routed)


class Model(nn.Module):
    def __init__(self, dim: int, layers: int, prototypes: int):
        super().__init__()
        self.blocks = nn.ModuleList(RoutedBlock(dim, prototypes) for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)  # save memory
        return self.head(x)


def main() -> None:
    torch.manual_seed(0)
    model = Model(dim=32, layers=4, prototypes=1024)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(500):
        x = torch.randn(4, 256, 32)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
