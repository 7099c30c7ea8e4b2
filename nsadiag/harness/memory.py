"""The "memory" job: a few training steps measured for memory.

The first forward runs under the saved-tensor ledger (bytes saved for backward per
module, NSA branch and layer; the largest saved tensors) and the per-layer allocator
deltas; on CUDA every step runs under the allocator's memory history, saved as
snapshot.pickle in `out_dir` (not recorded without one). ``nsadiag memory`` runs it in its
own process; its expandable-segments A/B runs it as a "memory" job in two fresh children
(the allocator reads PYTORCH_CUDA_ALLOC_CONF only when CUDA initialises).
"""

from __future__ import annotations

import contextlib
import resource
import statistics
from pathlib import Path
from typing import Any

from nsadiag.harness.step import train_step
from nsadiag.probes.gpu import gpu_state
from nsadiag.probes.memory import (
    LayerDeltas,
    SavedTensorLedger,
    cuda_allocator_stats,
    per_layer,
    standouts,
)
from nsadiag.probes.snapshot import memory_history
from nsadiag.rundir import write_bytes
from nsadiag.spec import TrialSpec
from nsadiag.targets import resolve


def measure_steps(spec: TrialSpec, out_dir: Path | None = None, top: int = 10
                  ) -> dict[str, Any]:
    """spec.steps steps of the spec's target in this process; the memory summary."""
    import torch

    torch.manual_seed(spec.seed)
    target = resolve(spec)
    device = next(target.model.parameters()).device
    optimizer = torch.optim.AdamW(target.model.parameters(), lr=1e-3)
    ledger = SavedTensorLedger(target.model)
    layers = LayerDeltas(target.blocks, device)
    step_s: list[float] = []
    with contextlib.ExitStack() as stack:
        if out_dir is None and device.type == "cuda":
            history = {"unavailable": "memory history: not recorded in this measurement"}
        else:
            history = stack.enter_context(memory_history(device, out_dir, write_bytes))
        for step in range(spec.steps):
            ids = torch.randint(target.vocab_size, (spec.batch, spec.seq_len + 1),
                                device=device)
            first = contextlib.ExitStack()
            if step == 0:
                first.enter_context(ledger)
            # the first forward also allocates one-off workspaces (cuBLAS takes ~32 MiB at
            # its first matmul): per-layer deltas come from the last step's forward
            if step == spec.steps - 1:
                first.enter_context(layers)
            _, times = train_step(target.loss, ids, optimizer,
                                  bfloat16=spec.dtype == "bfloat16", forward_context=first)
            step_s.append(times.step_s)
    rows = per_layer(ledger, target.blocks, layers.deltas)
    timed = step_s[1:] if len(step_s) > 1 else step_s  # step 0 pays one-off costs
    return {"device": device.type, "saved_total": ledger.total,
            "saved_by_module": ledger.by_module(), "saved_by_branch": ledger.by_branch(),
            "per_layer": rows, "layer_standouts": standouts(rows),
            "largest_saved": [e.to_dict() for e in ledger.largest(top)],
            "step_s": statistics.median(timed),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cuda": cuda_allocator_stats(device), "gpu": gpu_state(), "history": history}
