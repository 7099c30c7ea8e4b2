"""nsadiag memory: run a few training steps of a target in this process and report what
each module and NSA branch saves for backward, the largest saved tensors, peak RSS and,
on CUDA, the allocator's counters and fragmentation."""

from __future__ import annotations

import resource
from typing import Any

import torch

from nsadiag.probes.gpu import gpu_state
from nsadiag.probes.memory import SavedTensorLedger, cuda_allocator_stats
from nsadiag.spec import TrialSpec
from nsadiag.targets import resolve


def memory_command(spec: TrialSpec, top: int = 10) -> dict[str, Any]:
    """spec.steps steps; the first forward runs under the saved-tensor ledger."""
    torch.manual_seed(spec.seed)
    target = resolve(spec)
    device = next(target.model.parameters()).device
    optimizer = torch.optim.AdamW(target.model.parameters(), lr=1e-3)
    ledger = SavedTensorLedger(target.model)
    for step in range(spec.steps):
        ids = torch.randint(target.vocab_size, (spec.batch, spec.seq_len + 1), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16,
                            enabled=spec.dtype == "bfloat16"):
            if step == 0:
                with ledger:
                    loss = target.loss(ids)
            else:
                loss = target.loss(ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"saved_total": ledger.total, "saved_by_module": ledger.by_module(),
            "saved_by_branch": ledger.by_branch(),
            "largest_saved": [e.to_dict() for e in ledger.largest(top)],
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cuda": cuda_allocator_stats(device), "gpu": gpu_state()}
