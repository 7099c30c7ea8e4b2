"""The training script bench/bench_overhead.py times, plain and under `nsadiag run`.

    python bench/overhead_train.py --mode eager --steps 40
    python bench/overhead_train.py --mode compiled --steps 40    # torch.compile (inductor)
    python bench/overhead_train.py --mode small-modules --steps 400

"small-modules" (and "small-modules-compiled") is the shape where a cost per module call
shows: 64 residual blocks of Linear + LayerNorm + GELU, each its own module, width 32,
batch 16, SGD: steps of a few milliseconds made of about 260 tiny module calls.

A small decoder-only transformer LM (4 blocks, width 256, 4 heads, causal SDPA, GELU MLP,
batch 8 x 128 tokens of random ids) trained with AdamW. It times each step itself
(perf_counter around forward, backward and the optimizer step, and the CPU time all of its
threads used meanwhile, which a busy machine moves far less) and prints one JSON line at the
end: the median step time and CPU time over the steps after --warmup, the steps timed, the
final loss and Dynamo's counters (graphs compiled, graph breaks). It knows nothing of
nsadiag.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, BLOCKS, SEQ, BATCH = 512, 256, 4, 4, 128, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, -1).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, WIDTH))
        return x + self.mlp(self.norm2(x))


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class SmallBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear, self.norm, self.act = nn.Linear(width, width), nn.LayerNorm(width), \
            nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.norm(self.linear(x)))


def small_modules() -> nn.Module:
    return nn.Sequential(*[SmallBlock(32) for _ in range(64)], nn.Linear(32, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("eager", "compiled", "small-modules",
                                                 "small-modules-compiled"), default="eager")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's intra-op threads (1: the CPU time is the work, not "
                             "threads spinning for a core a busy machine holds)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    small = args.mode.startswith("small-modules")
    model = small_modules() if small else LM()
    if args.mode.endswith("compiled"):
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2) if small else \
        torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    times, cpu_times, loss = [], [], None
    for _ in range(args.warmup + args.steps):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
        started, cpu_started = time.perf_counter(), time.process_time()
        if small:
            loss = F.cross_entropy(model(x), y)
        else:
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
        cpu_times.append(time.process_time() - cpu_started)
    found = {"mode": args.mode, "median_step_s": statistics.median(times[args.warmup:]),
             "median_step_cpu_s": statistics.median(cpu_times[args.warmup:]),
             "steps": args.steps, "loss": round(loss.item(), 4), "graphs": 0, "graph_breaks": 0}
    if args.mode.endswith("compiled"):
        from torch._dynamo.utils import counters

        found.update(graphs=counters["stats"]["unique_graphs"],
                     graph_breaks=sum(counters["graph_break"].values()))
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
