"""Trains a tiny CNN on synthetic 32x32 images whose augmentation (random
crop + flip + brightness jitter) is offloaded to a
concurrent.futures.ProcessPoolExecutor with two worker processes.
build_augment() returns augment_batch, a function defined inside
build_augment() that closes over the crop size and jitter strength, and
augmented_batches() submits it with pool.submit(augment, batch). The defect:
a nested function (a local object) cannot be pickled, and every task sent to
a ProcessPoolExecutor must be pickled. The pool's queue feeder fails with
"AttributeError: Can't pickle local object 'build_augment.<locals>.augment_batch'",
that exception is set on the future, and future.result() re-raises it in
the main process, which exits with a traceback and status 1 before the first
training step.

Expected verdict: ERROR
Run: nsadiag run -- python repro/heldout/parallel_patch_augment.py
Cause words: Can't pickle local object | augment_batch | build_augment | pickle | ProcessPoolExecutor
Next words: module-level function | top-level function | functools.partial | ThreadPoolExecutor | move augment_batch out of build_augment
"""
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn as nn


def build_augment(crop=28, jitter=0.2):
    def augment_batch(images):
        n, _, h, w = images.shape
        top = torch.randint(0, h - crop + 1, (1,)).item()
        left = torch.randint(0, w - crop + 1, (1,)).item()
        out = images[:, :, top:top + crop, left:left + crop]
        flip = torch.rand(n) < 0.5
        out[flip] = out[flip].flip(-1)
        return out * (1 + jitter * (torch.rand(n, 1, 1, 1) - 0.5))
    return augment_batch


def augmented_batches(pool, augment, n_batches, batch_size=64):
    pending = []
    for _ in range(n_batches):
        images = torch.rand(batch_size, 3, 32, 32)
        labels = torch.randint(0, 10, (batch_size,))
        pending.append((pool.submit(augment, images), labels))
    for future, labels in pending:
        yield future.result(), labels


def main():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    augment = build_augment()
    with ProcessPoolExecutor(max_workers=2) as pool:
        for step, (x, y) in enumerate(augmented_batches(pool, augment, 40)):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
