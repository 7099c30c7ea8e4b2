"""A loop of many tiny module calls that reports what its main thread went through.

    python bench/gil_loop.py STEPS [--observe PARTS] [--compile]

The model is /work/shared/hooks/small_modules.py's (64 residual blocks of Linear, LayerNorm
and GELU, width 32, batch 16, SGD: about 260 module calls a step of a few milliseconds).
One JSON line at the end: the loop's wall seconds, the main thread's CPU seconds
(``time.thread_time``) and its voluntary and involuntary context switches
(``/proc/self/task/TID/status``) over the loop. A voluntary switch of the main thread in
this loop is a wait: it does no I/O, so it waits for the GIL another thread of the
process holds, and on a loaded machine for a core once the GIL is back.

``--observe`` starts nsadiag's in-process observer (nsadiag.harness.watched) in this
process itself, with only the parts named (comma-separated ``ObserverParts`` fields, or
``all``), writing to a temporary run directory: the attribution of bench/bench_gil_handoffs.py.
Under ``nsadiag run`` the observer is injected as usual and ``--observe`` is not given.
``--compile`` trains ``torch.compile(model)`` instead, after eight steps outside the timed
loop (the compile, and the observer's decision on its block hooks after the fifth, come
before it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path


def thread_switches(native_id: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of one thread of this process."""
    found = {}
    for line in Path(f"/proc/self/task/{native_id}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            found[key] = int(value)
    return found["voluntary_ctxt_switches"], found["nonvoluntary_ctxt_switches"]


def thread_cpu_s(native_id: int) -> float:
    """On-CPU seconds of one thread of this process (schedstat)."""
    return int(Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()[0]) / 1e9


def observe(parts: str, run_dir: Path) -> object:
    """Start the observer with the parts named (see the module docstring)."""
    from dataclasses import fields

    from nsadiag.harness.watched import ObserverParts, start

    names = {f.name for f in fields(ObserverParts)}
    wanted = names if parts == "all" else {p for p in parts.split(",") if p}
    unknown = wanted - names
    if unknown:
        raise SystemExit(f"gil_loop: no observer part {sorted(unknown)}; "
                         f"the parts: {sorted(names)}")
    return start(run_dir, parts=ObserverParts(**{n: n in wanted for n in names}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=int)
    parser.add_argument("--observe", default=None)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gil-loop-") as tmp:
        watched = observe(args.observe, Path(tmp)) if args.observe is not None else None
        import torch
        from torch import nn

        torch.manual_seed(0)
        torch.set_num_threads(1)

        from small_blocks import Block  # torch is imported here, after the observer

        model = nn.Sequential(*[Block(32) for _ in range(64)], nn.Linear(32, 4))
        optimizer = torch.optim.SGD(model.parameters(), 1e-2)
        x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
        if args.compile:
            model = torch.compile(model)
        if watched is not None:  # the observer's torch hooks go in once torch is imported
            deadline = time.monotonic() + 30
            while watched.finder is None and watched.root is None and \
                    time.monotonic() < deadline and watched.parts.torch_hooks:
                time.sleep(0.05)
        for _ in range(int(args.compile) * 8):  # the compile, outside the timed loop
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        native = threading.get_native_id()
        voluntary, involuntary = thread_switches(native)
        others = {t: (thread_switches(t.native_id)[0], thread_cpu_s(t.native_id))
                  for t in threading.enumerate()
                  if t.native_id != native and t.native_id is not None}
        cpu, started = time.thread_time(), time.perf_counter()
        for _ in range(args.steps):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
        after = thread_switches(native)
        # a sampler's switches: one sleep a sample, and one more for every wait for the GIL
        threads = {t.name: thread_switches(t.native_id)[0] - before[0]
                   for t, before in others.items() if t.is_alive()}
        threads_cpu = {t.name: round(thread_cpu_s(t.native_id) - before[1], 4)
                       for t, before in others.items() if t.is_alive()}
        if watched is not None:
            watched.stop()
    print(json.dumps({"loop_s": round(wall, 4), "cpu_s": round(cpu, 4),
                      "voluntary": after[0] - voluntary, "involuntary": after[1] - involuntary,
                      "threads": threads, "threads_cpu_s": threads_cpu}), flush=True)


if __name__ == "__main__":
    main()
