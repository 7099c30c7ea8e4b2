"""Defect: a per-token Python loop with a host read per token inside the loss function.

A plain training script (no nsadiag import). The loss weights each position by whether
its target token was already seen in the sequence, computed one token at a time with
`.item()`: one host read per token, in the loss, outside any module's forward.

Expected verdict: SLOW (slow by defect), naming the loop over `count` in `token_loss`
(not the outer `for step in range(...)` loop), with per-token advice:

    nsadiag run --deadline 15 --stall-timeout 30 -- python repro/scripts/loss_token_loop.py
"""

import torch
from torch import nn

SEQ_LEN, VOCAB = 4096, 256


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    losses = nn.functional.cross_entropy(logits, targets, reduction="none")
    seen: set[int] = set()
    weights = []
    for count in range(targets.shape[0]):
        token = targets[count].item()
        weights.append(0.5 if token in seen else 1.0)
        seen.add(token)
    return (losses * torch.tensor(weights)).mean()


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 64), nn.Linear(64, VOCAB))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20_000):  # a long run: no machine finishes it within the deadline
        tokens = torch.randint(0, VOCAB, (SEQ_LEN + 1,))
        logits = model(tokens[:-1])
        loss = token_loss(logits, tokens[1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
