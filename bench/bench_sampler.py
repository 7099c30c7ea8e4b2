"""What the progress sampler and the work counters cost a training step.

    python bench/bench_sampler.py [--layers 2] [--seq-len 2048] [--rounds 4] [--steps 3]

Trains the built-in NSA model (paper dimensions unless overridden) in this process and
times steps with the sampler thread and the work counters (nsadiag.probes.sampler,
nsadiag.probes.counters) off and on, alternating in rounds so that drift and load hit both
arms alike. Prints the median step time of each arm and the overhead; --json writes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from nsa.config import NSAConfig
from nsa.model import NSATransformer
from nsadiag.harness.step import train_step
from nsadiag.probes.counters import WorkCounters
from nsadiag.probes.sampler import Sampler


def steps(model, optimizer, ids, count: int) -> list[float]:
    return [train_step(model.loss, ids, optimizer)[1].step_s for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="Steps per arm per round.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    cfg = NSAConfig().replace(n_layers=args.layers)
    model = NSATransformer(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(cfg.vocab_size, (1, args.seq_len + 1))
    steps(model, optimizer, ids, 1)  # warm-up
    off: list[float] = []
    on: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            off += steps(model, optimizer, ids, args.steps)
            counters = WorkCounters().install()
            pulses: list[dict] = []
            sampler = Sampler(pulses.append, Path(tmp) / "profile.json", counters=counters)
            sampler.start()
            try:
                on += steps(model, optimizer, ids, args.steps)
            finally:
                sampler.stop()
                counters.remove()
    result = {"layers": args.layers, "seq_len": args.seq_len, "torch_threads":
              torch.get_num_threads(), "steps_per_arm": len(off),
              "off_median_s": statistics.median(off), "on_median_s": statistics.median(on),
              "off_s": off, "on_s": on}
    result["overhead"] = result["on_median_s"] / result["off_median_s"] - 1
    print(f"{args.layers} layers, S={args.seq_len}: step {result['off_median_s']:.3f} s "
          f"without, {result['on_median_s']:.3f} s with the sampler and counters "
          f"({result['overhead']:+.1%}, medians of {len(off)} steps each)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
