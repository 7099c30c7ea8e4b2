"""One training step, the one every nsadiag child and probe runs.

``train_step`` runs forward (under bf16 autocast when asked), backward and, with an
optimizer, the optimizer step and ``zero_grad``. ``on_phase(name)`` is called as each
phase begins ("forward", "backward", "optimizer"), which is where the heartbeat writes its
"start" events. Phase times synchronise CUDA at the phase boundaries only, never inside
the model.

``nsa.train`` keeps a step of its own (with gradient clipping and a schedule): ``nsa/``
imports nothing from nsadiag, and nsadiag must not import the built-in ``nsa`` for a
foreign target (a user's own package may be called ``nsa``).

torch is imported by the functions that use it, so a child can arm its probes first.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Phase = Callable[[str], None]


@dataclass
class StepTimes:
    """Seconds spent in each phase of one step."""

    forward_s: float
    backward_s: float
    optimizer_s: float

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s


def autocast(device: torch.device, bfloat16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on `device` when asked, else nothing."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bfloat16)


def synced_time(device: torch.device) -> float:
    """perf_counter after the device's queued work finished."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def train_step(loss_of: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor,
               optimizer: torch.optim.Optimizer | None = None, *, bfloat16: bool = False,
               on_phase: Phase | None = None,
               forward_context: contextlib.AbstractContextManager | None = None
               ) -> tuple[torch.Tensor, StepTimes]:
    """One step on token ids [B, S + 1]: returns the detached scalar loss and the phase
    times. ``forward_context`` wraps the forward only (e.g. a saved-tensor ledger)."""
    device = ids.device
    phase: Phase = on_phase or (lambda name: None)
    phase("forward")
    t0 = synced_time(device)
    with forward_context or contextlib.nullcontext(), autocast(device, bfloat16):
        loss = loss_of(ids)
    t1 = synced_time(device)
    phase("backward")
    loss.backward()
    t2 = synced_time(device)
    if optimizer is not None:
        phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    t3 = synced_time(device)
    return loss.detach(), StepTimes(t1 - t0, t2 - t1, t3 - t2)


def random_batch(vocab_size: int, batch: int, seq_len: int, generator: Any,
                 device: torch.device) -> torch.Tensor:
    """Token ids [batch, seq_len + 1] drawn from `generator` (a CPU torch.Generator)."""
    import torch

    return torch.randint(vocab_size, (batch, seq_len + 1), generator=generator).to(device)
