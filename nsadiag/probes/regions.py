"""Where in the library the main thread's sampled time went, by region: waiting for a
DataLoader batch, recomputing a checkpointed forward, compiling.

A region is a library function on the stack: a sample lies in it when any of its frames
is one of the region's (inclusive), so a wait inside the DataLoader's ``__next__`` counts
whatever queue or pipe it blocks on below. ``region_counts(stacks)`` counts the samples of
each region by phase, the samples in which the main thread was on the CPU, and the user
line the region was entered from in each phase (the innermost user frame above its
outermost frame) and the user line most samples ran below it (the innermost user frame
under it: the recomputed forward's line), over the profile's stacks
(nsadiag.probes.profile) once the model was built.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from nsadiag.probes.compiler import COMPILER_FILE
from nsadiag.probes.sampler import is_user_file

REGIONS: dict[str, tuple[re.Pattern[str], frozenset[str] | None]] = {
    # the next batch: its wait on the workers' queue, or its loading in this process
    "data": (re.compile(r"torch/utils/data/dataloader\.py$"), frozenset({"__next__"})),
    # a checkpointed function's forward run again (reentrant or not); its first forward
    # shows the same frames, so only the backward's samples are a recompute
    "checkpoint": (re.compile(r"torch/utils/checkpoint\.py$"), None),
    "compile": (COMPILER_FILE, None),
}


def _entry(frames: list[tuple[str, str, int]], pattern: re.Pattern[str],
           functions: frozenset[str] | None) -> int | None:
    """The index of the outermost frame of the region in ``frames`` (outermost first)."""
    for index, (function, file, _line) in enumerate(frames):
        if pattern.search(file) and (functions is None or function in functions):
            return index
    return None


def _where(function: str, file: str, line: int) -> str:
    return f"{function} ({Path(file).name}:{line})"


def region_counts(stacks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per region with samples: {"count", "on_cpu" (None without on-CPU counts),
    "by_phase", "entered_from": {phase: "main (train.py:57)"}, "inner": "forward
    (model.py:40)" or None}; see the module docstring."""
    timed = bool(stacks) and all("on_cpu" in entry for entry in stacks)
    found: dict[str, dict[str, Any]] = {}
    callers: dict[tuple[str, str], Counter] = {}
    inner: dict[str, Counter] = {}
    for entry in stacks:
        if entry.get("phase") == "build":
            continue
        frames = [tuple(frame) for frame in entry.get("frames", [])]
        count = int(entry.get("count", 0))
        for name, (pattern, functions) in REGIONS.items():
            at = _entry(frames, pattern, functions)
            if at is None:
                continue
            region = found.setdefault(name, {"count": 0, "on_cpu": 0 if timed else None,
                                             "by_phase": Counter()})
            region["count"] += count
            if timed:
                region["on_cpu"] += int(entry.get("on_cpu", 0))
            region["by_phase"][entry.get("phase") or "other"] += count
            above = [frame for frame in frames[:at] if is_user_file(frame[1])]
            if above:
                callers.setdefault((name, entry.get("phase") or "other"), Counter())[
                    _where(*above[-1])] += count
            below = [frame for frame in frames[at:] if is_user_file(frame[1])]
            if below:
                inner.setdefault(name, Counter())[_where(*below[-1])] += count
    for name, region in found.items():
        region["by_phase"] = dict(region["by_phase"])
        region["entered_from"] = {phase: top.most_common(1)[0][0] for (of, phase), top in
                                  callers.items() if of == name}
        region["inner"] = inner[name].most_common(1)[0][0] if name in inner else None
    return found
