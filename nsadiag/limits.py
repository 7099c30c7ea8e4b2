"""Limits on the sizes a user gives, set against this machine.

A typo in a size (``--world-size 10000``, ``--layers 1-100000``, ``--seq-len
99999999999999999999``) must not start work that cannot end: ten thousand ranks on two
cores, a hundred thousand trials, a tensor larger than any memory. Each check raises
ValueError with one line that names the option, the limit and this machine's figure, and
how to go past it (``--no-limits``: the limits are refused sizes, not measured costs).

- ranks (``--world-size``): at most RANKS_PER_CPU per usable CPU;
- a sweep: at most MAX_SWEEP_POINTS trials (layer counts, sequence lengths) — each trial
  is a process of its own that imports torch and builds the model;
- layers (``--layers``, ``--max-layers``): at most MAX_LAYERS;
- tokens (``--seq-len`` x ``--batch``): at most this machine's memory at
  BYTES_PER_TOKEN a token, a floor no model gets under (its int64 token ids and one
  float32 activation 14 values wide).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

RANKS_PER_CPU = 4
MAX_SWEEP_POINTS = 64
MAX_LAYERS = 1024
BYTES_PER_TOKEN = 64
OVERRIDE = "--no-limits runs it anyway"


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_memory() -> int:
    """Bytes of memory this process can have: the machine's, or its cgroup's limit when
    lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_world_size(world_size: int, option: str = "world-size") -> None:
    """ValueError (one line) for more ranks than RANKS_PER_CPU per usable CPU."""
    cpus = usable_cpus()
    limit = RANKS_PER_CPU * cpus
    if world_size > limit:
        raise ValueError(f"{option}: {world_size} ranks exceed this machine's limit of {limit} "
                         f"({RANKS_PER_CPU} per usable CPU, and it has {cpus}); {OVERRIDE}")


def check_layers(n_layers: int | None, option: str = "layers") -> None:
    """ValueError (one line) for more than MAX_LAYERS layers."""
    if n_layers is not None and n_layers > MAX_LAYERS:
        raise ValueError(f"{option}: {n_layers} layers exceed the limit of {MAX_LAYERS}; "
                         f"{OVERRIDE}")


def check_sweep(points: Sequence[int], option: str) -> None:
    """ValueError (one line) for a sweep of more than MAX_SWEEP_POINTS trials."""
    if len(points) > MAX_SWEEP_POINTS:
        raise ValueError(f"{option}: {len(points)} values mean {len(points)} trials, each a "
                         f"process of its own; the limit is {MAX_SWEEP_POINTS} per sweep; "
                         f"{OVERRIDE}")


def check_tokens(seq_len: int, batch: int, option: str = "seq-len") -> None:
    """ValueError (one line) when ``batch`` sequences of ``seq_len`` tokens need more than
    this machine's memory at BYTES_PER_TOKEN a token."""
    need, memory = seq_len * batch * BYTES_PER_TOKEN, machine_memory()
    if need > memory:
        raise ValueError(f"{option}: {seq_len} tokens x batch {batch} need at least "
                         f"{_gib(need)} ({BYTES_PER_TOKEN} bytes a token, a floor), and this "
                         f"machine has {_gib(memory)} of memory; {OVERRIDE}")


def check_layer_counts(counts: Sequence[int], option: str = "layers") -> None:
    """A layer sweep: at most MAX_SWEEP_POINTS counts, none above MAX_LAYERS."""
    check_sweep(counts, option)
    check_layers(max(counts, default=None), option)
