"""Tiny "pkg.module:factory" targets for the nsadiag trial and target tests.

Each factory returns a small nn.Module whose forward takes ids [B, S]; each has one trait
a test needs (a narrow signature, a scalar loss, a failing backward, a sleeping forward).
"""

from __future__ import annotations

import threading
import time

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 32
DIM = 16


class TinyBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.mix = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.mix(x))


class TinyLM(nn.Module):
    """embed -> n_layers x TinyBlock -> head: ids [B, S] -> logits [B, S, VOCAB]."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(TinyBlock(DIM) for _ in range(n_layers))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def tiny_lm(n_layers: int = 2, seq_len: int = 16) -> TinyLM:
    """Accepts only n_layers and seq_len (seq_len is unused: the model takes any length)."""
    return TinyLM(n_layers)


class ScalarLoss(nn.Module):
    """Returns its own scalar loss (next-token CE within ids [B, S]) instead of logits."""

    def __init__(self, n_layers: int):
        super().__init__()
        self.lm = TinyLM(n_layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.lm(ids)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def scalar_loss(n_layers: int = 2) -> ScalarLoss:
    return ScalarLoss(n_layers)


class _FailInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("injected failure in backward of block 1")


class FailingBlock(TinyBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FailInBackward.apply(super().forward(x))


def fails_in_backward(n_layers: int = 2) -> TinyLM:
    """A TinyLM whose block 1 raises RuntimeError in backward (needs n_layers >= 2)."""
    model = TinyLM(n_layers)
    model.layers[1] = FailingBlock(DIM)
    return model


class SleepyBlock(TinyBlock):
    def __init__(self, dim: int, sleep_s: float):
        super().__init__(dim)
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return super().forward(x)


def _idle_worker() -> None:
    while True:
        time.sleep(3600)


def sleepy(sleep_s: float = 60.0) -> TinyLM:
    """A one-block TinyLM whose block sleeps `sleep_s` seconds in every forward, plus an
    idle daemon thread (like a data loader's), so a stack dump has two Python threads."""
    threading.Thread(target=_idle_worker, name="idle-worker", daemon=True).start()
    model = TinyLM(1)
    model.layers[0] = SleepyBlock(DIM, sleep_s)
    return model



class AllocatingBlock(TinyBlock):
    def __init__(self, dim: int, nbytes: int):
        super().__init__(dim)
        self.nbytes = nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = bytearray(self.nbytes)  # a Python-level allocation: MemoryError on failure
        return super().forward(x) + len(scratch) * 0.0


def allocates_in_forward(nbytes: int = 1 << 20) -> TinyLM:
    """A one-block TinyLM whose block allocates `nbytes` of Python memory in forward."""
    model = TinyLM(1)
    model.layers[0] = AllocatingBlock(DIM, nbytes)
    return model


class HoardingBlock(TinyBlock):
    """Saves a [B, S, 64 * DIM] activation for backward (exp keeps its output)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = torch.exp(x.repeat(1, 1, 64) * 0.01)
        return super().forward(x) + wide.mean(-1, keepdim=True)


def hoards_in_layer(n_layers: int = 4, hoarder: int = 2) -> TinyLM:
    """A TinyLM whose block `hoarder` saves about 64x what each other block saves."""
    model = TinyLM(n_layers)
    model.layers[hoarder] = HoardingBlock(DIM)
    return model


_HELD = threading.Lock()


class _WaitInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        _HELD.acquire(blocking=False)  # taken here, released nowhere
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        with _HELD:
            return grad


class WaitingBlock(TinyBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _WaitInBackward.apply(super().forward(x))


def waits_in_backward(n_layers: int = 2) -> TinyLM:
    """A TinyLM whose last block deadlocks inside its own backward (after the block's
    backward started), on a lock its forward took."""
    model = TinyLM(n_layers)
    model.layers[n_layers - 1] = WaitingBlock(DIM)
    return model


ESCAPED_HELPER_MARKER = "nsadiag test: escaped helper"
ESCAPED_HELPER = f"import time  # {ESCAPED_HELPER_MARKER}\nwhile True:\n    time.sleep(1)\n"


def escapes(n_layers: int = 2) -> TinyLM:
    """Starts a helper in a session of its own (out of reach of a process-group kill) and
    returns a healthy TinyLM."""
    import subprocess
    import sys

    subprocess.Popen([sys.executable, "-c", ESCAPED_HELPER], start_new_session=True)
    return TinyLM(n_layers)
