"""Reusable scratch buffers for the tiled CPU/GPU ops."""

from __future__ import annotations

import math

import torch


class Workspace:
    """Flat fp32 buffers that every tile and chunk of one call reuses by name.

    A fresh multi-MiB tensor comes back from the OS page by page, and on the CPU those page
    faults cost about as much as the arithmetic done on it; so the large temporaries are
    allocated once per call (growing when a later chunk needs more)."""

    def __init__(self, device: torch.device):
        self.device, self.buffers = device, {}

    def take(self, name: str, *shape: int) -> torch.Tensor:
        """An uninitialised [*shape] fp32 view of buffer `name`."""
        numel = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.numel() < numel:
            buffer = self.buffers[name] = torch.empty(numel, device=self.device)
        return buffer[:numel].view(shape)
