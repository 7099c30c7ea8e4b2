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
  float32 activation 14 values wide);
- time a command plans to watch or sample a live process (``attach --duration``,
  ``stacks --samples`` x ``--interval``): at most MAX_WATCH_S, and at most
  MAX_STACK_SAMPLES samples per process. These are not overridden: past them lies a typo
  (and, near 300 years, clocks that overflow), not a bigger job.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from nsadiag.fmt import gib

RANKS_PER_CPU = 4
MAX_SWEEP_POINTS = 64
MAX_LAYERS = 1024
BYTES_PER_TOKEN = 64
OVERRIDE = "--no-limits runs it anyway"
MAX_WATCH_S = 30 * 86400
"""30 days: the longest a command watches or samples one live process."""
MAX_STACK_SAMPLES = 10_000
"""Stack samples per process: each is a py-spy run of a second or so (three are the
default; a thousand already show every thread that matters)."""


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
                         f"{gib(need, '.3g')} ({BYTES_PER_TOKEN} bytes a token, a floor), and this "
                         f"machine has {gib(memory, '.3g')} of memory; {OVERRIDE}")


def check_layer_counts(counts: Sequence[int], option: str = "layers") -> None:
    """A layer sweep: at most MAX_SWEEP_POINTS counts, none above MAX_LAYERS."""
    check_sweep(counts, option)
    check_layers(max(counts, default=None), option)


def _days(seconds: float) -> str:
    return f"{seconds:.3g} s ({seconds / 86400:.3g} days)"


def check_watch_seconds(seconds: float, option: str, least: float = 1.0) -> None:
    """ValueError (one line) for a time to watch below ``least`` seconds (or not a number)
    or longer than MAX_WATCH_S (infinity included)."""
    if not seconds >= least:
        raise ValueError(f"{option}: must be >= {least:g} seconds, got {seconds:g}")
    if seconds > MAX_WATCH_S:
        raise ValueError(f"{option}: {_days(seconds)} is longer than the longest watch, "
                         f"{_days(MAX_WATCH_S)}")


def check_stack_sampling(samples: int, interval_s: float) -> None:
    """ValueError (one line) for a sampling plan (``samples`` samples ``interval_s`` apart)
    beyond MAX_STACK_SAMPLES or MAX_WATCH_S, saying the plan."""
    if samples < 1:
        raise ValueError(f"samples: must be >= 1, got {samples}")
    if not (math.isfinite(interval_s) and interval_s >= 0):
        raise ValueError(f"interval: must be >= 0 seconds, got {interval_s:g}")
    planned = (samples - 1) * interval_s
    if samples > MAX_STACK_SAMPLES or planned > MAX_WATCH_S:
        option = "samples" if samples > MAX_STACK_SAMPLES else "interval"
        raise ValueError(f"{option}: {samples} samples {interval_s:g} s apart take "
                         f"{_days(planned)} per process; the limits are "
                         f"{MAX_STACK_SAMPLES} samples and {_days(MAX_WATCH_S)}")
