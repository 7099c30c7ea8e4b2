"""Trains a small MLP embedding network with a triplet margin loss on
synthetic clustered feature vectors, and after every step logs a
nearest-neighbour retrieval accuracy on the current batch. The training step
itself is vectorised and cheap; there is no hang or crash. The problem is
performance: retrieval_accuracy() computes the pairwise distance matrix with
a pure-Python double loop over the batch (for i ... for j ...), calling
torch.dist() and .item() for each of the 256 x 256 pairs, i.e. about 65k tiny
tensor ops and Python-float conversions per step, which takes far longer than
the training step. The run makes steady progress but needs many minutes for
its 400 steps, and it is run with a deadline much shorter than that.

Expected verdict: SLOW
Run: nsadiag run --deadline 20 -- python repro/heldout/triplet_embedding_trainer.py
Cause words: retrieval_accuracy | nested loop | torch.dist | .item() | pairwise distance
Next words: torch.cdist | vectorize | compute the distance matrix in one call | evaluate less often | longer deadline
"""
import time

import torch
import torch.nn as nn

N_CLASSES = 16
IN_DIM = 64
BATCH = 256
STEPS = 400


def make_batch(centers):
    labels = torch.randint(0, N_CLASSES, (BATCH,))
    x = centers[labels] + 0.5 * torch.randn(BATCH, IN_DIM)
    return x, labels


def retrieval_accuracy(emb, labels):
    n = emb.shape[0]
    hits = 0
    for i in range(n):
        best_j, best_d = -1, float("inf")
        for j in range(n):
            if i == j:
                continue
            d = torch.dist(emb[i], emb[j]).item()
            if d < best_d:
                best_j, best_d = j, d
        hits += int(labels[best_j] == labels[i])
    return hits / n


def main():
    torch.manual_seed(0)
    centers = torch.randn(N_CLASSES, IN_DIM) * 2
    net = nn.Sequential(nn.Linear(IN_DIM, 128), nn.ReLU(), nn.Linear(128, 32))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    triplet = nn.TripletMarginLoss(margin=1.0)
    t0 = time.time()
    for step in range(STEPS):
        x, labels = make_batch(centers)
        emb = net(x)
        perm = torch.randperm(BATCH)
        pos = torch.empty(BATCH, dtype=torch.long)
        for c in range(N_CLASSES):
            idx = (labels == c).nonzero().flatten()
            if len(idx):
                pos[idx] = idx[torch.randperm(len(idx))]
        loss = triplet(emb, emb[pos], emb[perm])
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc = retrieval_accuracy(emb.detach(), labels)
        print(f"step {step}/{STEPS} loss {loss.item():.4f} r@1 {acc:.3f} "
              f"elapsed {time.time() - t0:.1f}s", flush=True)
    print("training complete")


if __name__ == "__main__":
    main()
