"""Token sources for training: a learnable synthetic task and byte-level text.

Both sources yield int64 batches [b, S + 1] (S + 1 because the loss predicts ids[:, 1:]).
A batch is a pure function of (seed, step, rank, world_size): step `s` draws one global
batch [world_size * b, S + 1] from a generator seeded by (seed, s), and rank r keeps rows
[r * b, (r + 1) * b). So a DDP run with W ranks of b rows sees exactly the batch of one
process with W * b rows, and resuming at step k needs nothing but k.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch

TEXT_FILE = "kjv_genesis_exodus.txt"
_MASK64 = (1 << 64) - 1


def default_text_path() -> Path:
    """The shipped corpus: King James Version, Genesis and Exodus (public domain, ~388 KB)."""
    return Path(__file__).resolve().parent / "texts" / TEXT_FILE


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator seeded by a splitmix64 hash of (seed, step).

    Hashing rather than seed + step keeps the streams of neighbouring seeds unrelated.
    """
    z = (seed * 0x9E3779B97F4A7C15 + step + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return torch.Generator().manual_seed(z & ((1 << 63) - 1))


class _ShardedSource(ABC):
    """Common part: per-rank slice of a deterministic global batch."""

    def __init__(self, seq_len: int, batch: int, seed: int, rank: int, world_size: int):
        if seq_len < 1 or batch < 1:
            raise ValueError(f"seq_len and batch must be positive, got {seq_len}, {batch}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.seq_len, self.batch, self.seed = seq_len, batch, seed
        self.rank, self.world_size = rank, world_size

    def global_batch(self, step: int) -> torch.Tensor:
        """int64 [world_size * batch, seq_len + 1]: every rank's rows of step `step`."""
        rows = self.world_size * self.batch
        return self._draw(step_generator(self.seed, step), rows)

    def batch_at(self, step: int) -> torch.Tensor:
        """int64 [batch, seq_len + 1]: this rank's rows of the global batch of `step`."""
        start = self.rank * self.batch
        return self.global_batch(step)[start:start + self.batch].contiguous()

    @abstractmethod
    def _draw(self, gen: torch.Generator, rows: int) -> torch.Tensor:
        """int64 [rows, seq_len + 1] drawn from `gen`."""


class SyntheticData(_ShardedSource):
    """A copy task: each row tiles a random pattern of period p in [2, max_period].

    After the first period every token is determined by the one p positions back, so a
    model that learns to attend there (an induction head) drives the loss towards
    ~ (p / S) * ln(vocab_size); an untrained model sits at ln(vocab_size).
    """

    def __init__(self, seq_len: int, batch: int, vocab_size: int = 256, seed: int = 0,
                 rank: int = 0, world_size: int = 1, max_period: int = 16):
        super().__init__(seq_len, batch, seed, rank, world_size)
        if vocab_size < 2 or max_period < 2:
            raise ValueError(f"vocab_size and max_period must be >= 2, got "
                             f"{vocab_size}, {max_period}")
        self.vocab_size, self.max_period = vocab_size, max_period

    def _draw(self, gen: torch.Generator, rows: int) -> torch.Tensor:
        length = self.seq_len + 1
        periods = torch.randint(2, self.max_period + 1, (rows, 1), generator=gen)
        patterns = torch.randint(0, self.vocab_size, (rows, self.max_period), generator=gen)
        positions = torch.arange(length).unsqueeze(0) % periods  # [rows, S+1]
        return patterns.gather(1, positions)


class ByteTextData(_ShardedSource):
    """Random windows of S + 1 bytes (vocab 256) of a text file, read once into memory."""

    def __init__(self, path: str | Path | None, seq_len: int, batch: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        super().__init__(seq_len, batch, seed, rank, world_size)
        self.path = Path(path) if path is not None else default_text_path()
        raw = self.path.read_bytes()
        if len(raw) < seq_len + 1:
            raise ValueError(f"text file {self.path} has {len(raw)} bytes, fewer than "
                             f"seq_len + 1 = {seq_len + 1}")
        self.tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)

    def _draw(self, gen: torch.Generator, rows: int) -> torch.Tensor:
        length = self.seq_len + 1
        starts = torch.randint(0, self.tokens.numel() - length + 1, (rows, 1), generator=gen)
        return self.tokens[starts + torch.arange(length)]
