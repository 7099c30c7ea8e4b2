"""Defect: DataLoader workers forked while a thread of the main process holds a lock.

A plain training script (no nsadiag import). The dataset guards its lazily built
vocabulary with a `threading.Lock`; a background thread computes token statistics for
logging and holds that lock while it does. The loop creates its DataLoader iterator (which
forks the workers) while the statistics thread runs, so each worker starts with a copy of
the lock that is locked and that no thread of the worker will ever release. A worker's
first `__getitem__` waits on it forever, and the main process waits forever for its batch.

Expected verdict: DEADLOCK, naming DataLoader worker 0 of the main process and the
dataset's `with self.lock:` line where it waits:

    nsadiag run --stall-timeout 10 -- python repro/scripts/dataloader_worker_hang.py
"""

import threading
from collections import Counter

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class TokenDataset(Dataset):
    def __init__(self, n: int, seq_len: int):
        self.n, self.seq_len = n, seq_len
        self.lock = threading.Lock()
        self.vocab: dict[int, int] | None = None
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, 512, (n, seq_len + 1), generator=generator)

    def __len__(self) -> int:
        return self.n

    def token_counts(self) -> Counter:
        with self.lock:  # held while the statistics are computed
            counts: Counter = Counter()
            for row in self.tokens.tolist():
                counts.update(zip(row, row[1:]))  # bigrams
            return counts

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:  # the defect: a forked worker's copy of the lock is never released
            if self.vocab is None:
                self.vocab = {token: token % 256 for token in range(512)}
        row = self.tokens[index].apply_(self.vocab.__getitem__)
        return row[:-1], row[1:]


def main() -> None:
    torch.manual_seed(0)
    dataset = TokenDataset(16384, 256)
    stats = threading.Thread(target=lambda: print(f"{len(dataset.token_counts())} bigrams",
                                                  flush=True), daemon=True)
    stats.start()
    loader = DataLoader(dataset, batch_size=8, num_workers=2, shuffle=True)
    model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (inputs, targets) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
