"""Trains a logistic click-through model on a JSON-lines file of logged
impressions. At start the script writes 6,000 records (a 24-float feature
vector and a 0/1 click label each, about 1.6 MB) to clicks.jsonl inside a
tempfile.TemporaryDirectory, and wraps it in ClickLogDataset, read through a
torch DataLoader(batch_size=16, shuffle=True, num_workers=0). The defect is
in ClickLogDataset.__getitem__: for every single item it opens the file,
reads all lines and json.loads() every record, then returns just
records[idx], so each sample costs a full parse of the 1.6 MB file (about
50 ms) and each batch of 16 close to a second. Nothing hangs; the
run makes slow but steady progress (one epoch would take many minutes) and
is run with a short deadline.

Expected verdict: SLOW
Run: nsadiag run --deadline 20 -- python repro/heldout/jsonl_click_dataset.py
Cause words: __getitem__ | json.loads | ClickLogDataset | re-reads the file | readlines
Next words: parse once in __init__ | cache the records | load the file once | byte offsets index | longer deadline
"""
import json
import os
import random
import tempfile
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

N_RECORDS = 6000
N_FEATURES = 24


def write_click_log(path):
    rng = random.Random(0)
    w = [rng.gauss(0, 1) for _ in range(N_FEATURES)]
    with open(path, "w") as f:
        for i in range(N_RECORDS):
            feats = [round(rng.gauss(0, 1), 5) for _ in range(N_FEATURES)]
            score = sum(a * b for a, b in zip(w, feats))
            f.write(json.dumps({"id": i, "features": feats, "click": int(score > 0)}) + "\n")


class ClickLogDataset(Dataset):
    def __init__(self, path):
        self.path = path
        with open(path) as f:
            self.n = sum(1 for _ in f)

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        with open(self.path) as f:
            records = [json.loads(line) for line in f.readlines()]
        rec = records[idx]
        return torch.tensor(rec["features"]), torch.tensor(float(rec["click"]))


def main():
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "clicks.jsonl")
        write_click_log(path)
        print(f"wrote {os.path.getsize(path) / 1e6:.1f} MB click log", flush=True)
        loader = DataLoader(ClickLogDataset(path), batch_size=16, shuffle=True, num_workers=0)
        model = nn.Linear(N_FEATURES, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        t0 = time.time()
        for epoch in range(3):
            for step, (x, y) in enumerate(loader):
                loss = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                print(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.4f} "
                      f"elapsed {time.time() - t0:.1f}s", flush=True)
        print("training complete")


if __name__ == "__main__":
    main()
