import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run under its CPU interpreter here; it must be on before they are built
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nsa.config import NSAConfig


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def tiny_config(**changes) -> NSAConfig:
    """Small shapes that exercise every rule: l=8, d=4, l_sel=16, w=12."""
    base = NSAConfig(dim=32, n_heads=4, n_kv_heads=2, head_dim=8, l=8, d=4, l_sel=16,
                     n_sel=3, w=12, query_chunk=16, compress_hidden=16, n_layers=2,
                     vocab_size=64)
    return base.replace(**changes)
