"""Before training, the script preprocesses the raw corpus by running a
separate Python tokeniser process with subprocess.Popen(stdout=PIPE), waits
for it to finish with proc.wait(), then parses the token ids the tokeniser
printed (one line per document) into tensors and trains a small bag-of-ids
model. The defect: the tokeniser writes several MB to its stdout pipe, but the
parent calls proc.wait() before reading proc.stdout; once the ~64 KB pipe
buffer is full the child blocks in write() and the parent blocks in wait(),
forever.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/shard_preprocess_subprocess.py
Cause words: proc.wait | stdout=PIPE | PIPE | run_tokenizer
Next words: communicate | read stdout before wait | subprocess.run | file instead of a pipe
"""
import subprocess
import sys

import torch
import torch.nn as nn

TOKENIZER_SRC = r"""
import random, sys
rng = random.Random(0)
for doc in range(20000):
    ids = [rng.randrange(1000) for _ in range(64)]
    sys.stdout.write(" ".join(map(str, ids)) + "\n")
"""


def run_tokenizer():
    proc = subprocess.Popen([sys.executable, "-c", TOKENIZER_SRC],
                            stdout=subprocess.PIPE, text=True)
    rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"tokenizer failed with {rc}")
    lines = proc.stdout.read().splitlines()
    return torch.tensor([[int(t) for t in ln.split()] for ln in lines])


def main():
    print("tokenizing corpus...", flush=True)
    ids = run_tokenizer()
    labels = (ids[:, 0] > 500).long()
    model = nn.Sequential(nn.EmbeddingBag(1000, 32), nn.Linear(32, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(0, len(ids), 256):
        loss = nn.functional.cross_entropy(model(ids[step:step + 256]), labels[step:step + 256])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 2560 == 0:
            print(f"step {step // 256} loss={loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
