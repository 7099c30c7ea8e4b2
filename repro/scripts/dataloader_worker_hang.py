"""Defect: DataLoader workers forked while a thread of the main process holds a lock.

A plain training script (no nsadiag import). The dataset guards its lazily built
vocabulary with a `threading.Lock`. After each epoch a background thread computes token
statistics for the log, holding that lock while it counts. The next epoch's DataLoader
iterator forks its workers while the statistics thread runs, so each worker starts with a
copy of the lock that is locked and that no thread of the worker will ever release: the
worker's first `__getitem__` waits on it forever, and the main process waits forever for
its batch.

Expected verdict: DEADLOCK, naming DataLoader worker 0 of the main process and the
dataset's `with self.lock:` line where it waits:

    nsadiag run --stall-timeout 5 -- python repro/scripts/dataloader_worker_hang.py
"""

import threading
from collections import Counter

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class TokenDataset(Dataset):
    def __init__(self, n: int, seq_len: int):
        self.lock = threading.Lock()
        self.vocab: dict[int, int] | None = None
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, 512, (n, seq_len + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def token_counts(self) -> Counter:
        with self.lock:  # held while the statistics are counted
            counts: Counter = Counter()
            for row in self.tokens.tolist():
                counts.update(zip(row, row[1:], strict=False))
            return counts

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:
            if self.vocab is None:
                self.vocab = {token: token % 256 for token in range(512)}
        row = self.tokens[index].apply_(self.vocab.__getitem__)
        return row[:-1], row[1:]


def log_statistics(dataset: TokenDataset, epoch: int) -> None:
    print(f"epoch {epoch}: {len(dataset.token_counts())} distinct bigrams", flush=True)


def main() -> None:
    torch.manual_seed(0)
    dataset = TokenDataset(2048, 128)
    loader = DataLoader(dataset, batch_size=256, num_workers=2, shuffle=True)
    model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(5):
        for step, (inputs, targets) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 8 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}", flush=True)
        # the defect: the next epoch forks its workers while this thread holds the lock
        threading.Thread(target=log_statistics, args=(dataset, epoch), daemon=True).start()


if __name__ == "__main__":
    main()
