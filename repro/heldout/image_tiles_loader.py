"""Trains a tiny convolutional net on synthetic high-resolution image tiles
served by a DataLoader with num_workers=2 and batch_size=8. Each sample is a
3x512x512 float tensor, so every collated batch (~25 MB) is sent from the
worker processes to the trainer through shared memory in /dev/shm. The defect
is the environment, not the code: the container's /dev/shm is only 1 MB, so
the workers cannot allocate the shared-memory segment for a batch and the
DataLoader fails with a RuntimeError about shared memory / no space left on
device.

Expected verdict: ERROR
Run: nsadiag run -- unshare -m bash -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec python repro/heldout/image_tiles_loader.py'
Cause words: /dev/shm | shared memory | No space left on device | num_workers
Next words: /dev/shm | shm-size | num_workers=0 | ipc=host
"""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class TileDataset(Dataset):
    def __init__(self, n=256, size=512):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, self.size, self.size, generator=g)
        return img, int(img.mean() > 0.5)


def main():
    loader = DataLoader(TileDataset(), batch_size=8, shuffle=True, num_workers=2)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(),
        nn.Conv2d(8, 16, 5, stride=4), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 2),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 5 == 0:
                print(f"epoch {epoch} step {step} loss={loss.item():.4f}", flush=True)
    print("done")


if __name__ == "__main__":
    main()
