"""What one watched block call costs: the figure behind BLOCK_HOOK_CALL_S.

    python bench/bench_block_hooks.py --rounds 7 --steps 300

A module with any forward hook leaves torch's fast path in ``Module._call_impl``; what that
and the hook's own body add to one call is measured in one process, on the main thread's
CPU time (``time.thread_time``):

- per call: one block of bench/gil_loop.py's model (Linear, LayerNorm, GELU, width 32,
  batch 16, in training mode with autograd recording) called ``--calls`` times plain, then
  as often with nsadiag's block pre-hook (``WorkCounters.block_hook``), alternately,
  ``--chunks`` times; the cost of a hooked call is the median over the chunks of the
  difference. Alternating short chunks leaves what a loaded machine does to the CPU time
  (other work in the cache, the clock) to both alike; a step's CPU time moved by 10 %
  between rounds at load 8.
- per step, as a check on the whole: the model (64 such blocks, SGD, a few milliseconds a
  step) trains ``--steps`` steps plain and with the hook on every block, ``--rounds`` times.
- in the observer (``--observer``): the same model trained under nsadiag's in-process
  observer (nsadiag.harness.watched, every part on), which thins its block hooks after the
  first steps (nsadiag.harness.thinning); then ``--steps`` steps at a time alternately with
  the hooks it kept, with a hook on every block, and with no block hook, ``--rounds`` times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from small_blocks import Block  # bench/ is the script's own folder
from torch import nn

from nsadiag.probes.counters import WorkCounters


def cpu_per_step(model: nn.Module, optimizer: Any, batch: tuple[torch.Tensor, torch.Tensor],
                 steps: int) -> float:
    x, y = batch
    started = time.thread_time()
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (time.thread_time() - started) / steps


def hooked_call_s(block: nn.Module, counters: WorkCounters, calls: int, chunks: int
                  ) -> list[float]:
    """Per chunk: the CPU seconds one hooked call of ``block`` costs over a plain one."""
    x = torch.randn(16, 32)
    hook = counters.block_hook("block")
    found = []
    for _ in range(chunks):
        started = time.thread_time()
        for _ in range(calls):
            block(x)
        plain = time.thread_time() - started
        handle = block.register_forward_pre_hook(hook)
        started = time.thread_time()
        for _ in range(calls):
            block(x)
        hooked = time.thread_time() - started
        handle.remove()
        found.append((hooked - plain) / calls)
    return found


def observer_rounds(model: nn.Module, optimizer: Any, batch: Any, steps: int, rounds: int
                    ) -> list[dict]:
    """CPU time per step under the in-process observer with its block hooks as it kept
    them, on every block, and on none (see the module docstring)."""
    import tempfile

    from nsadiag.harness import thinning, watched

    with tempfile.TemporaryDirectory(prefix="bench-block-hooks-") as tmp:
        heartbeat = watched.ProcessHeartbeat(Path(tmp))
        heartbeat.start()
        deadline = time.monotonic() + 30
        while heartbeat.finder is None and time.monotonic() < deadline:
            time.sleep(0.02)
        cpu_per_step(model, optimizer, batch, 2 * thinning.BLOCK_HOOK_SAMPLE_STEPS)
        names = [name for name, _ in heartbeat.blocks]
        kept = heartbeat.block_stride

        def hook_every(stride: int | None) -> None:
            for handle in heartbeat.block_handles.values():
                handle.remove()
            heartbeat.block_handles.clear()
            if stride is not None:
                for block in thinning.watched_blocks(names, stride):
                    heartbeat._hook_block(block)

        rows = []
        for round_ in range(rounds):
            load = float(Path("/proc/loadavg").read_text().split()[0])
            found = {"round": round_, "load": load, "stride": kept}
            variants = [("kept", kept), ("every", 1), ("none", None)]
            for variant, stride in variants[round_ % 3:] + variants[:round_ % 3]:  # rotated
                hook_every(stride)
                found[variant] = cpu_per_step(model, optimizer, batch, steps)
            hook_every(kept)
            print(f"observer round {round_}: load {load:.2f}  one block in {kept} watched "
                  f"{found['kept'] * 1e3:.3f} ms/step, every block "
                  f"{found['every'] * 1e3:.3f}, none {found['none'] * 1e3:.3f}", flush=True)
            rows.append(found)
        heartbeat.stop(remove=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=300)
    parser.add_argument("--observer", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    blocks = [Block(32) for _ in range(args.blocks)]
    model = nn.Sequential(*blocks, nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), 1e-2)
    batch = (torch.randn(16, 32), torch.randint(0, 4, (16,)))
    counters = WorkCounters()
    cpu_per_step(model, optimizer, batch, 20)  # warm-up: allocator, first-call paths
    load = float(Path("/proc/loadavg").read_text().split()[0])
    per_call = hooked_call_s(blocks[0], counters, args.calls, args.chunks)
    quartiles = statistics.quantiles(per_call, n=4)
    print(f"one hooked call: median {statistics.median(per_call) * 1e6:.2f} us, quartiles "
          f"{quartiles[0] * 1e6:.2f}-{quartiles[2] * 1e6:.2f} us over {args.chunks} chunks "
          f"of {args.calls} calls (load {load:.2f} before)", flush=True)
    rows = []
    for round_ in range(args.rounds):
        load = float(Path("/proc/loadavg").read_text().split()[0])
        plain = cpu_per_step(model, optimizer, batch, args.steps)
        handles = [block.register_forward_pre_hook(counters.block_hook(f"{i}"))
                   for i, block in enumerate(blocks)]
        hooked = cpu_per_step(model, optimizer, batch, args.steps)
        for handle in handles:
            handle.remove()
        call_s = (hooked - plain) / args.blocks
        rows.append({"round": round_, "load": load, "plain_step_cpu_s": plain,
                     "hooked_step_cpu_s": hooked, "hooked_call_s": call_s})
        print(f"round {round_}: load {load:.2f}  plain {plain * 1e3:.3f} ms/step  hooked "
              f"{hooked * 1e3:.3f} ms/step  +{(hooked / plain - 1):.1%}  one hooked call "
              f"{call_s * 1e6:.2f} us", flush=True)
    observed = observer_rounds(model, optimizer, batch, args.steps, args.rounds) \
        if args.observer else []
    for variant in ("kept", "every") if observed else ():
        ratios = [r[variant] / r["none"] for r in observed]
        print(f"observer, block hooks {variant} over none: median {statistics.median(ratios):.3f}"
              f" (range {min(ratios):.3f}-{max(ratios):.3f})")
    print(json.dumps({"observer": observed, "cpus": len(os.sched_getaffinity(0)),
                      "torch": torch.__version__,
                      "load_before": load, "calls": args.calls, "chunks": args.chunks,
                      "hooked_call_s_median": statistics.median(per_call),
                      "hooked_call_s_quartiles": [quartiles[0], quartiles[2]],
                      "blocks": args.blocks, "steps": args.steps,
                      "step_hooked_call_s_median": statistics.median(
                          r["hooked_call_s"] for r in rows),
                      "rows": rows}))


if __name__ == "__main__":
    main()
