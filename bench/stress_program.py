"""What real training code does to the frames a sampler reads, for ``seconds`` seconds, in
one process: the program the sampler stress harness (bench/stress_sampler.py) runs.

The main thread cycles through: a per-token loop calling SDPA through a small wrapper inside
FlopCounterMode, a counting TorchDispatchMode, functions behind ``torch._dynamo.disable``,
a compiled model (compiled once, then stepped), generators, closures reading loop counters
through cells, and a DataLoader with worker processes; eight threads beside it run their
own loops. With ``--sampler`` nsadiag's progress sampler (and its work counters) watches the
main thread at ``--interval`` seconds, ten times its usual rate.

Prints one JSON line: the rounds done, the peak and final resident memory (MiB) and,
with the sampler, its counted failures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode


class CountingMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops += 1
        return func(*args, **(kwargs or {}))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


@torch._dynamo.disable
def disabled_step(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 2


def per_token(x: torch.Tensor) -> torch.Tensor:
    rows = []
    for t in range(x.shape[2]):
        rows.append(attend(x[:, :, t:t + 1], x[:, :, : t + 1], x[:, :, : t + 1]))
        if t % 8 == 0:
            rows[-1] = disabled_step(rows[-1])
    return torch.cat(rows, dim=2)


def tokens(n: int) -> Iterator[int]:
    for position in range(n):
        yield position * position


def closures(n: int) -> int:
    total = 0
    for step in range(n):
        def read() -> int:
            return step  # noqa: B023 - a loop counter held in a cell
        total += read() + sum(tokens(8))
    return total


def background(stop: threading.Event, counts: list[int], index: int) -> None:
    while not stop.is_set():
        block = torch.randn(32, 32)
        for i in range(64):
            block = torch.tanh(block @ block.T / 32 + i)
        counts[index] += 1
        stop.wait(0.005)  # busy, without starving the main thread of the GIL


def round_once(model: nn.Module, compiled: nn.Module, loader: DataLoader) -> None:
    x = torch.randn(1, 2, 48, 16)
    with FlopCounterMode(display=False):
        per_token(x)
    with CountingMode():
        per_token(x[:, :, :16])
    closures(200)
    for batch, target in loader:
        loss = F.mse_loss(model(batch), target)
        loss.backward()
    for _ in range(5):
        compiled(torch.randn(8, 32)).sum().backward()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seconds", type=float)
    parser.add_argument("--sampler", action="store_true")
    parser.add_argument("--interval", type=float, default=0.01)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # the sampler's counters hook every module; torch warns about it at each compiled call
    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)`")
    sampler = None
    if args.sampler:
        from nsadiag.probes.counters import WorkCounters
        from nsadiag.probes.sampler import Sampler

        out = Path(tempfile.mkdtemp(prefix="stress-sampler-"))
        counters = WorkCounters().install()
        sampler = Sampler(lambda fields: None, out / "profile.json", counters=counters,
                          interval_s=args.interval, pulse_s=0.5)
        sampler.start()
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    compiled = torch.compile(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)))
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 32))
    loader = DataLoader(data, batch_size=16, num_workers=2, persistent_workers=True)
    stop, counts = threading.Event(), [0] * 8
    threads = [threading.Thread(target=background, args=(stop, counts, i), daemon=True)
               for i in range(8)]
    for thread in threads:
        thread.start()
    rounds, started = 0, time.monotonic()
    while time.monotonic() - started < args.seconds:
        round_once(model, compiled, loader)
        rounds += 1
    stop.set()
    for thread in threads:
        thread.join(10)
    failures = None
    if sampler is not None:
        sampler.stop()
        failures = sampler.failures
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(f"/proc/{os.getpid()}/statm") as statm:
        rss_mib = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    print(json.dumps({"rounds": rounds, "background": sum(counts), "peak_mib": peak_mib,
                      "rss_mib": round(rss_mib, 1), "sampler_failures": failures}),
          flush=True)


if __name__ == "__main__":
    main()
