"""Sentiment classifier over synthetic product reviews: ReviewDataset turns
each review into a fixed-length tensor of token ids using a word-to-id
vocabulary built by build_vocab() from the whole corpus (sorted by frequency),
and an EmbeddingBag + Linear model trains on it with a DataLoader in the main
process (num_workers=0), printing progress every batch. The defect:
ReviewDataset.__getitem__ calls build_vocab(self.corpus) on every call instead
of once in __init__, so each sample re-tokenises and re-counts all 20k
reviews; the loop is data-bound in the main process and crawls, while the
model itself takes almost no time.

Expected verdict: SLOW
Run: nsadiag run --deadline 30 -- python repro/heldout/review_sentiment_dataset.py
Cause words: build_vocab | __getitem__ | ReviewDataset | Counter
Next words: build the vocabulary once | __init__ | cache | precompute
"""
import random
import time
from collections import Counter

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

WORDS = [f"w{i}" for i in range(3000)] + ["great", "bad", "love", "broken"]
MAX_LEN = 32


def build_vocab(corpus):
    counts = Counter(tok for text in corpus for tok in text.split())
    return {tok: i + 1 for i, (tok, _) in enumerate(counts.most_common())}


class ReviewDataset(Dataset):
    def __init__(self, n=20000):
        rng = random.Random(0)
        self.corpus, self.labels = [], []
        for _ in range(n):
            label = rng.random() < 0.5
            words = rng.choices(WORDS, k=rng.randint(8, 24))
            words.append("great" if label else "bad")
            self.corpus.append(" ".join(words))
            self.labels.append(int(label))

    def __len__(self):
        return len(self.corpus)

    def __getitem__(self, i):
        vocab = build_vocab(self.corpus)
        ids = [vocab.get(t, 0) for t in self.corpus[i].split()][:MAX_LEN]
        ids += [0] * (MAX_LEN - len(ids))
        return torch.tensor(ids), self.labels[i]


def main():
    ds = ReviewDataset()
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=0)
    model = nn.Sequential(nn.EmbeddingBag(len(WORDS) + 1, 32, mode="mean"), nn.Linear(32, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    t0 = time.time()
    for step, (ids, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(ids), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"batch {step}/{len(loader)} loss={loss.item():.4f} "
              f"elapsed={time.time() - t0:.1f}s", flush=True)
    print("epoch done")


if __name__ == "__main__":
    main()
