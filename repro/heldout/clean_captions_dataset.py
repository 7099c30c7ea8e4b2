r"""Caption dataset for a tiny bag-of-words classifier: raw captions go through
clean_caption(), which strips markup and keeps a caption only if it looks like
a plain run of words (checked with re.fullmatch against WORDS_RE), then the
cleaned text is hashed into a bag-of-words tensor and a linear model trains on
it. The defect: WORDS_RE = r"(\w+\s?)+$" has nested quantifiers, so on a
long caption that is almost a run of words but ends with a stray character
(here a scraped caption ending in "!") re.fullmatch backtracks exponentially
and the data pipeline spins at 100% CPU inside the regex call forever.

Expected verdict: STALL-BUSY
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/clean_captions_dataset.py
Cause words: fullmatch | WORDS_RE | clean_caption | backtracking
Next words: possessive | atomic | rewrite the regex | simpler pattern
"""
import re

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

WORDS_RE = re.compile(r"(\w+\s?)+$")
TAG_RE = re.compile(r"<[^>]+>")
DIM = 512


def clean_caption(text: str) -> str:
    text = TAG_RE.sub(" ", text).strip().lower()
    if not WORDS_RE.fullmatch(text):
        return ""
    return text


class CaptionDataset(Dataset):
    def __init__(self, n=2000):
        g = torch.Generator().manual_seed(0)
        words = ["red", "car", "dog", "on", "the", "grass", "a", "small", "cat", "sits"]
        self.items = []
        for i in range(n):
            idx = torch.randint(len(words), (8,), generator=g).tolist()
            self.items.append(("<b>" + " ".join(words[j] for j in idx) + "</b>", i % 2))
        self.items[37] = ("photo" + "a" * 40 + " by user!", 1)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        raw, label = self.items[i]
        text = clean_caption(raw)
        vec = torch.zeros(DIM)
        for tok in text.split():
            vec[hash(tok) % DIM] += 1.0
        return vec, label


def main():
    loader = DataLoader(CaptionDataset(), batch_size=16, shuffle=False, num_workers=0)
    model = nn.Linear(DIM, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss={loss.item():.4f}", flush=True)
    print("epoch done")


if __name__ == "__main__":
    main()
