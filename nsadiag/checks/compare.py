"""Tensor comparison shared by the checks: max abs error against a reference, with the
fp32 tolerance scaled by the reference's magnitude (TOLERANCE * max(1, max |ref|))."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nsadiag.checks import TOLERANCE


@dataclass
class Difference:
    """err = max |got - ref| (inf when shapes differ); scale = max |ref|; ok = err <= tol."""

    err: float
    scale: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.err <= self.tol


def difference(got: torch.Tensor | None, ref: torch.Tensor | None,
               tolerance: float = TOLERANCE) -> Difference:
    """Compare two tensors (None is a missing gradient: zeros of the other's shape)."""
    if got is None and ref is None:
        return Difference(0.0, 0.0, tolerance)
    if got is None or ref is None:
        present = got if ref is None else ref
        got = torch.zeros_like(present) if got is None else got
        ref = torch.zeros_like(present) if ref is None else ref
    ref64, got64 = ref.detach().double(), got.detach().double()
    scale = float(ref64.abs().max()) if ref64.numel() else 0.0
    tol = tolerance * max(1.0, scale)
    if got64.shape != ref64.shape:
        return Difference(float("inf"), scale, tol)
    err = float((got64 - ref64).abs().max()) if ref64.numel() else 0.0
    return Difference(err, scale, tol)


def random_ids(vocab_size: int, batch: int, length: int, seed: int,
               device: torch.device) -> torch.Tensor:
    """Token ids [batch, length] from a generator of its own (the global RNG is untouched)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(vocab_size, (batch, length), generator=generator).to(device)


def model_device(model: torch.nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")
