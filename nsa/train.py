"""Training entry point: `python -m nsa.train ...`, or `train(TrainArgs(...))` from Python.

One step: draw this rank's batch ids [b, S + 1] (nsa.data, a pure function of seed, step and
rank), loss = next-token cross entropy (under bf16 autocast when dtype is bfloat16),
backward, clip the global grad norm, AdamW step, cosine-with-warm-up learning rate step.

Under torchrun (`torch.distributed.is_torchelastic_launched()`) the model is wrapped in
DistributedDataParallel (gloo on CPU, nccl on CUDA); `--batch` is per rank, and rank r draws
rows [r*b, (r+1)*b) of the global batch, so W ranks of b rows train exactly like one process
of W*b rows.

Every rank appends JSON lines to its heartbeat file, flushed per line: "start", then per step
{"t", "event": "step", "step", "loss" (mean over ranks), "lr", "grad_norm", "tokens_per_s"
(this rank's), "step_s", "rss_bytes", ["cuda_allocated", "cuda_reserved"], "rank",
"world_size"}, then "end" with "status" ok or error. Rank 0 writes checkpoints atomically to
OUT/checkpoint.pt; resuming from step k reproduces the uninterrupted run's losses from step
k + 1 on, bit for bit on CPU. `--stop-at N` ends an invocation early (preemptible queues)
without changing the --steps schedule.

Every bad option ends the CLI with one line `nsa.train: error: ...` on stderr and exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from nsa.training.loop import train
from nsa.training.optim import lr_factor
from nsa.training.options import PROG, TrainArgs, UsageError, parse_args, parse_set_value
from nsa.training.runtime import Runtime, setup_runtime, teardown_runtime, wrap_for_training

__all__ = ["Runtime", "TrainArgs", "UsageError", "lr_factor", "main", "parse_args",
           "parse_set_value", "setup_runtime", "teardown_runtime", "train",
           "wrap_for_training"]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 on any usage error)."""
    try:
        summary = train(parse_args(argv))
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    _report(summary)
    return 0


def _report(summary: dict[str, Any]) -> None:
    if summary["rank"] != 0:
        return
    losses = summary["losses"]
    final = f"final loss {losses[-1]:.4f}, " if losses else ""
    print(f"{PROG}: done at step {summary['step']}: {final}"
          f"{summary['tokens_per_s']:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
