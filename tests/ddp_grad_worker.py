"""torchrun worker of tests/nsa/test_ddp.py: one DDP forward/backward on this rank's shard.

    python -m torch.distributed.run --standalone --nproc_per_node W ddp_grad_worker.py OUT

Every rank builds the same tiny model (fixed seed) and back-propagates the loss of its
rows of the step-0 global batch; DDP averages the gradients, and rank 0 saves them to OUT
as {parameter name: grad}. `reference_grads` computes the same on one process from the
whole global batch.
"""

from __future__ import annotations

import sys

import torch

from nsa.config import NSAConfig
from nsa.data import SyntheticData
from nsa.model import NSATransformer
from nsa.train import Runtime, setup_runtime, teardown_runtime, wrap_for_training

SEED = 1234
SEQ_LEN = 64
BATCH_PER_RANK = 2


def tiny_config() -> NSAConfig:
    return NSAConfig(dim=64, n_heads=4, n_kv_heads=2, head_dim=16, l=8, d=4, l_sel=16,
                     n_sel=3, w=32, n_layers=2, vocab_size=256)


def grads_of_step(runtime: Runtime, batch: int) -> dict[str, torch.Tensor]:
    """{name: grad} after one forward/backward of this rank's `batch` rows of step 0."""
    torch.manual_seed(SEED)
    model = NSATransformer(tiny_config())
    trainee = wrap_for_training(model, runtime)
    data = SyntheticData(SEQ_LEN, batch, seed=SEED, rank=runtime.rank,
                         world_size=runtime.world_size)
    trainee(data.batch_at(0)).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def reference_grads(world_size: int) -> dict[str, torch.Tensor]:
    """The single-process gradients of the concatenated global batch."""
    runtime = Runtime(0, 1, torch.device("cpu"), distributed=False)
    return grads_of_step(runtime, world_size * BATCH_PER_RANK)


def main(out: str) -> None:
    runtime = setup_runtime("cpu", pg_timeout=60)
    finished = False
    try:
        grads = grads_of_step(runtime, BATCH_PER_RANK)
        if runtime.rank == 0:
            torch.save({"world_size": runtime.world_size, "grads": grads}, out)
        finished = True
    finally:
        teardown_runtime(runtime, finished)


if __name__ == "__main__":
    main(sys.argv[1])
