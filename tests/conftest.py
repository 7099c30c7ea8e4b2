import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run under its CPU interpreter here; it must be on before they are built
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def restore_threads():
    """Torch's intra-op thread count as it was before the test (training sets its own)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
