"""What a sampled profile says: the hottest lines of the user's code and the loops that moved.

The progress sampler (nsadiag.probes.sampler) writes ``profile.json`` in the watched
process: every sampled stack of the main thread (frames outermost first, each
``[function, file, line]``), counted, with the phase, module and autograd op at the time,
and the integer locals of user frames that changed between samples ("loops"). A few
stack samples taken at a stall name a frame by chance; hundreds of samples over the whole
run name where the time went, and a loop variable that rose from 0 to 812 at 8 per second
names the loop.

``folded(profile)`` writes the stacks in the collapsed format flame-graph viewers open;
``summarize(profile)`` reduces one such file to plain dicts a verdict and a report quote:

- ``samples``, ``duration_s``: how many stacks, over how long;
- ``phases``: samples per phase ("forward", "backward", "other");
- ``hot_lines``: the innermost user-code line of each sample, counted, most first:
  ``{"where": "attend (model.py:42)", "code": "...", "count": 130, "fraction": 0.81}``;
- ``loops``: integer locals of user frames that count a loop (the source assigns them in
  a ``for`` or with ``+=``; they rise between samples and restart when the loop is entered
  again), per (function, file, variable), most advanced first: ``{"where", "variable",
  "advanced", "restarts", "last", "rate_per_s", "observations"}``; ``rate_per_s`` is the
  rise per second while it rose;
- ``backward_ops``: the autograd ops the backward samples were in, counted, most first.
"""

from __future__ import annotations

import ast
import functools
import json
import linecache
from collections import Counter
from pathlib import Path
from typing import Any

from nsadiag.probes.sampler import PROFILE_VERSION, is_user_file

TOP = 5
MIN_OP_SHARE = 0.1
"""A backward op seen in fewer of the backward samples is not worth a sentence (most
backwards are not instrumented: their samples carry no op)."""
MIN_LOOP_STEPS = 3
"""Without the source, a local that rose fewer times than this is a value that changed,
not a loop counter."""


def read_profile(path: Path) -> dict[str, Any] | None:
    """The profile at ``path``; None when missing, torn or of another version."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
        return None
    return data


def _where(function: str, file: str, line: int) -> str:
    return f"{function} ({Path(file).name}:{line})"


def _hot_lines(stacks: list[dict[str, Any]], samples: int) -> list[dict[str, Any]]:
    counts: Counter = Counter()
    code: dict[tuple[str, str, int], str | None] = {}
    for entry in stacks:
        user = [tuple(frame) for frame in entry.get("frames", []) if is_user_file(frame[1])]
        if not user:
            continue
        key = user[-1]
        counts[key] += int(entry.get("count", 0))
        code.setdefault(key, linecache.getline(key[1], key[2]).strip() or None)
    return [{"where": _where(*key), "file": key[1], "line": key[2], "code": code[key],
             "count": count, "fraction": count / samples if samples else 0.0}
            for key, count in counts.most_common(TOP)]


def _assigned_by_loop(source: str, function: str, variable: str) -> bool:
    """Whether ``variable`` is a loop target (``for variable in ...``, a comprehension's
    ``for``) or a counter (``variable += ...``) inside a function named ``function``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            for inner in ast.walk(node):
                targets = (inner.target,) if isinstance(inner, (ast.For, ast.AsyncFor,
                                                                  ast.comprehension,
                                                                  ast.AugAssign)) else ()
                for target in targets:
                    if any(isinstance(name, ast.Name) and name.id == variable
                           for name in ast.walk(target)):
                        return True
    return False


@functools.lru_cache(maxsize=64)
def loop_variable(file: str, function: str, variable: str) -> bool | None:
    """Whether the source says ``variable`` counts a loop in ``function`` (see
    _assigned_by_loop); None when the source cannot be read or parsed."""
    source = "".join(linecache.getlines(file))
    if not source:
        return None
    try:
        return _assigned_by_loop(source, function, variable)
    except (SyntaxError, ValueError, RecursionError):
        return None


def _loops(loops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The loop counters among the integer locals, most advanced first: a local the source
    assigns in a ``for`` or with ``+=`` that rose between samples. Without the source, a
    local that rose at least MIN_LOOP_STEPS times and at least as often as it fell."""
    found = []
    for loop in loops:
        advanced, restarts = int(loop["advanced"]), int(loop["restarts"])
        rises = int(loop["observations"]) - 1 - restarts
        by_source = loop_variable(loop["file"], loop["function"], loop["variable"])
        by_readings = rises >= MIN_LOOP_STEPS and rises >= restarts
        if advanced <= 0 or not (by_source if by_source is not None else by_readings):
            continue
        seconds = float(loop["advancing_s"])
        found.append({"where": _where(loop["function"], loop["file"], loop["line"]),
                      "variable": loop["variable"], "advanced": advanced,
                      "restarts": restarts, "last": loop["last"][1],
                      "rate_per_s": advanced / seconds if seconds > 0 else None,
                      "observations": int(loop["observations"])})
    found.sort(key=lambda loop: loop["advanced"], reverse=True)
    return found[:TOP]


def folded(profile: dict[str, Any]) -> str:
    """The profile's stacks in the collapsed ("folded") format that flamegraph.pl,
    speedscope and inferno read: one line per stack, frames outermost first joined by ";",
    then a space and the sample count. The phase and, in backward, the autograd op are the
    outermost frames, so a flame graph splits forward from backward at its root."""
    lines = []
    for entry in profile.get("stacks", []):
        frames = [f"{function} ({Path(file).name}:{line})".replace(";", ",")
                  for function, file, line in entry.get("frames", [])]
        root = [f"[{entry.get('phase') or 'other'}]"]
        if entry.get("op"):
            root.append(f"[{entry['op']}]")
        lines.append(f"{';'.join(root + frames)} {int(entry.get('count', 0))}")
    return "\n".join(lines) + ("\n" if lines else "")


def summarize(profile: dict[str, Any]) -> dict[str, Any]:
    """The summary described in the module docstring."""
    samples = int(profile.get("samples", 0))
    stacks = list(profile.get("stacks", []))
    phases: Counter = Counter()
    ops: Counter = Counter()
    for entry in stacks:
        count = int(entry.get("count", 0))
        phases[entry.get("phase") or "other"] += count
        if entry.get("phase") == "backward" and entry.get("op"):
            ops[entry["op"]] += count
    first, last = profile.get("first_t"), profile.get("last_t")
    return {"samples": samples,
            "duration_s": (last - first) if first is not None and last is not None else None,
            "phases": dict(phases), "hot_lines": _hot_lines(stacks, samples),
            "loops": _loops(list(profile.get("loops", []))),
            "backward_ops": [{"op": op, "count": n} for op, n in ops.most_common(TOP)]}


def describe(summary: dict[str, Any]) -> list[str]:
    """Sentences for a verdict: where the samples fell, the hottest user line, the busiest
    backward op and the most advanced loop."""
    samples, duration = summary.get("samples", 0), summary.get("duration_s")
    if not samples:
        return []
    over = f" over {duration:.0f} s" if duration else ""
    phases = summary.get("phases") or {}
    split = ", ".join(f"{phase} {count / samples:.0%}" for phase, count in
                      sorted(phases.items(), key=lambda item: -item[1]))
    sentences = [f"sampled profile: {samples} stacks{over} ({split})"]
    hot = summary.get("hot_lines") or []
    if hot:
        line = hot[0]
        code = f" `{line['code']}`" if line.get("code") else ""
        sentences.append(f"hottest line of user code: {line['where']}{code} in "
                         f"{line['fraction']:.0%} of the samples")
    ops = summary.get("backward_ops") or []
    in_backward = phases.get("backward", 0)
    if ops and ops[0]["count"] >= MIN_OP_SHARE * in_backward:
        sentences.append(f"busiest backward op: {ops[0]['op']} in "
                         f"{ops[0]['count'] / in_backward:.0%} of the backward samples")
    loops = summary.get("loops") or []
    if loops:
        loop = loops[0]
        rate = (f" at {loop['rate_per_s']:.1f}/s" if loop.get("rate_per_s") is not None
                else "")
        again = f", restarted {loop['restarts']} times" if loop["restarts"] else ""
        sentences.append(f"loop variable `{loop['variable']}` in {loop['where']} advanced "
                         f"{loop['advanced']}{rate}{again}: a loop iterating")
    return sentences
