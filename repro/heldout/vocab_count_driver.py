"""Builds a token-frequency vocabulary for a text classifier by running the
counting step in a child Python process: build_vocab() launches this same
file with --count-tokens via subprocess.Popen(..., stdout=subprocess.PIPE),
and the child prints one "token<TAB>count" line per vocabulary entry (about
1.5 MB of text in total). The defect is that the parent calls proc.wait()
before reading proc.stdout. Once the child has written more than the 64 KiB
the OS pipe buffer holds, its print() blocks in write() because nobody reads
the pipe, and the parent blocks in wait() (waitpid) for a child that can never
exit. Both processes sleep without using CPU.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/vocab_count_driver.py
Cause words: proc.wait | stdout=subprocess.PIPE | pipe buffer | build_vocab | waitpid
Next words: communicate | read stdout before wait | proc.stdout.read() | redirect to a file
"""
import random
import subprocess
import sys

import torch
import torch.nn as nn

VOCAB_SIZE = 60000


def count_tokens():
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    for i in range(VOCAB_SIZE):
        word = "".join(rng.choice(letters) for _ in range(rng.randint(3, 12)))
        print(f"{word}_{i}\t{rng.randint(1, 100000)}")


def build_vocab(min_count=5):
    proc = subprocess.Popen([sys.executable, __file__, "--count-tokens"],
                            stdout=subprocess.PIPE, text=True)
    rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"token counter exited with {rc}")
    vocab = {"<pad>": 0, "<unk>": 1}
    for line in proc.stdout:
        token, count = line.rstrip("\n").split("\t")
        if int(count) >= min_count:
            vocab[token] = len(vocab)
    return vocab


def main():
    print("counting tokens...", flush=True)
    vocab = build_vocab()
    print(f"vocab size {len(vocab)}", flush=True)
    model = nn.EmbeddingBag(len(vocab), 32)
    head = nn.Linear(32, 2)
    opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=1e-3)
    for step in range(50):
        ids = torch.randint(0, len(vocab), (16, 20))
        y = torch.randint(0, 2, (16,))
        loss = nn.functional.cross_entropy(head(model(ids)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"done, loss {loss.item():.4f}")


if __name__ == "__main__":
    if "--count-tokens" in sys.argv:
        count_tokens()
    else:
        main()
