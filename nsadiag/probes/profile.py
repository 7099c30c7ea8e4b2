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
- ``hot_lines``: the innermost user-code line of each sample, counted, the lines the main
  thread was on the CPU at most first (where the profile has on-CPU counts), then by
  samples: ``{"where": "attend (model.py:42)", "code": "...", "count": 130,
  "fraction": 0.81, "on_cpu": 120, "training_fraction": 0.9, "phase": "forward",
  "phase_fraction": 0.95}``; ``fraction`` is of all samples, ``on_cpu`` the samples in
  which the main thread ran (None for a profile without on-CPU counts),
  ``training_fraction`` of those taken once the model was built (every phase but
  "build"), ``phase_fraction`` of the samples of the phase the line was seen in most (a
  forward loop's line is absent from backward samples, whose Python stack is the autograd
  engine's);
- ``loops``: integer locals of user frames that count a loop (the source assigns them in
  a ``for`` or with ``+=``; they rise between samples and restart when the loop is entered
  again), per (function, file, variable), most advanced first: ``{"where", "variable",
  "advanced", "restarts", "last", "rate_per_s", "observations", "by_one", "file",
  "function", "for_line", "end", "phase", "module", "pass_rate_per_s", "eta_s"}``;
  ``rate_per_s`` is the rise per second while it rose; ``by_one`` says the source steps
  it by one (``range(n)``, ``enumerate``, ``+= 1``: its value counts iterations), None
  without the source; ``for_line`` is the line of its ``for`` statement, ``end`` where
  its ``range`` ends (read from the frame's locals), ``phase`` and ``module`` where it was
  last read, ``pass_rate_per_s`` its rise per second in the current pass and ``eta_s``
  the seconds that pass needs to reach ``end`` at that pace (None when unknown);
- ``held_off_s``: seconds, by phase, in which the sampler could not run while the main
  thread did (native code holding the GIL): no sample stands for them;
- ``memory``: per kind ("rss", "cuda"), the first, last and peak reading, the bytes still
  held above the first, and ``holder``, the frame that keeps allocating across steps
  (see ``_memory``): ``{"where", "code", "held", "steps"}``, None when no frame took
  memory in two steps;
- ``backward_ops``: the autograd ops the backward samples were in, counted, most first;
- ``frames``: every line seen on the sampled stacks with its inclusive share (samples with
  it anywhere on the stack) and self share (samples with it innermost), the user's own
  code first (``user`` True), each part by inclusive share: ``{"where", "function",
  "file", "line", "user", "inclusive", "self", "inclusive_share", "self_share"}``. Lines,
  not functions: the profile names a function without its class, so two ``forward``
  methods of one file would merge. Only stacks taken once the model was built count
  (shares are of those: the "build" phase is start-up, imports and nsadiag's own
  reference timings), and nsadiag's own frames (the harness on every stack, the work
  count's dispatch mode in step 0's forward) and the interpreter's start-up frames are
  left out;
- ``backward_modules``: the backward samples by the watched module whose backward was
  running (the heartbeat's innermost open module) and the autograd op then running
  (None where that backward was not instrumented), most first:
  ``{"module", "op", "count", "share"}`` (share of the backward samples);
- ``backward_by_module``: the same summed per module, with its busiest op:
  ``{"module", "count", "share", "op", "op_share"}``.
- ``regions``: the samples in the library's DataLoader ``__next__``, checkpoint recompute
  and compiler, by phase, with the user line each was entered from
  (nsadiag.probes.regions).

``tables(summary)`` renders the frames and the backward attribution as Markdown tables for
a report.
"""

from __future__ import annotations

import ast
import functools
import json
import linecache
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsadiag.probes.frames import INSTRUMENTATION_PATH
from nsadiag.probes.loops import for_loop
from nsadiag.probes.regions import region_counts
from nsadiag.probes.sampler import READABLE_VERSIONS, is_user_file

TOP = 5
TABLE_ROWS = 8
"""Rows of each part (user code, the rest) of the frames table."""
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
    if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
        return None
    return data


def _where(function: str, file: str, line: int) -> str:
    return f"{function} ({Path(file).name}:{line})"


def _hot_lines(stacks: list[dict[str, Any]], samples: int, phases: Counter
               ) -> list[dict[str, Any]]:
    counts: Counter = Counter()
    on_cpu: Counter = Counter()
    by_phase: dict[tuple[str, str, int], Counter] = {}
    code: dict[tuple[str, str, int], str | None] = {}
    timed = bool(stacks) and all("on_cpu" in entry for entry in stacks)
    for entry in stacks:
        user = [tuple(frame) for frame in entry.get("frames", []) if is_user_file(frame[1])]
        if not user:
            continue
        key = user[-1]
        counts[key] += int(entry.get("count", 0))
        on_cpu[key] += int(entry.get("on_cpu", 0))
        by_phase.setdefault(key, Counter())[entry.get("phase") or "other"] += \
            int(entry.get("count", 0))
        code.setdefault(key, linecache.getline(key[1], key[2]).strip() or None)
    training = samples - phases.get("build", 0)
    order = sorted(counts, key=lambda key: (-on_cpu[key], -counts[key])) if timed else \
        [key for key, _ in counts.most_common()]
    lines = []
    for key in order[:TOP]:
        count = counts[key]
        phase, in_phase = by_phase[key].most_common(1)[0]
        lines.append({"where": _where(*key), "file": key[1], "line": key[2], "code": code[key],
                      "count": count, "fraction": count / samples if samples else 0.0,
                      "on_cpu": on_cpu[key] if timed else None,
                      # of the samples once the model was built: its build samples
                      # are left out of the count as well as of the whole
                      "training_fraction": (count - by_phase[key].get("build", 0)) /
                      training if training else 0.0,
                      "phase": phase, "phase_fraction": in_phase / phases[phase]
                      if phases.get(phase) else 0.0})
    return lines


def _waiting_line(stacks: list[dict[str, Any]], samples: int) -> dict[str, Any] | None:
    """The user line the samples fell on most while the main thread was off the CPU (a
    wait), when that is the line most samples fell on; None otherwise or without on-CPU
    counts."""
    if not stacks or not all("on_cpu" in entry for entry in stacks):
        return None
    counts: Counter = Counter()
    waiting: Counter = Counter()
    for entry in stacks:
        user = [tuple(frame) for frame in entry.get("frames", []) if is_user_file(frame[1])]
        if user:
            counts[user[-1]] += int(entry.get("count", 0))
            waiting[user[-1]] += int(entry.get("count", 0)) - int(entry.get("on_cpu", 0))
    if not counts:
        return None
    key, count = counts.most_common(1)[0]
    if 2 * waiting[key] <= count:
        return None
    return {"where": _where(*key), "code": linecache.getline(key[1], key[2]).strip() or None,
            "count": count, "fraction": count / samples if samples else 0.0,
            "waiting": waiting[key]}


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


def _counts_by_one(source: str, function: str, variable: str) -> bool:
    """Whether ``variable`` steps by one inside ``function``: ``for variable in range(n)``
    or ``range(a, b)`` (or a step of literal 1), the index of ``enumerate``, or
    ``variable += 1``; its value is then the number of iterations so far."""
    def is_one(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value == 1

    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and
                node.name == function):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.AugAssign) and isinstance(inner.target, ast.Name) and \
                    inner.target.id == variable and isinstance(inner.op, ast.Add) and \
                    is_one(inner.value):
                return True
            if not isinstance(inner, (ast.For, ast.AsyncFor, ast.comprehension)) or \
                    not isinstance(inner.iter, ast.Call) or \
                    not isinstance(inner.iter.func, ast.Name):
                continue
            call, target = inner.iter, inner.target
            if call.func.id == "range" and isinstance(target, ast.Name) and \
                    target.id == variable and not call.keywords and \
                    (len(call.args) in (1, 2) or (len(call.args) == 3 and is_one(call.args[2]))):
                return True
            if call.func.id == "enumerate" and isinstance(target, ast.Tuple) and \
                    target.elts and isinstance(target.elts[0], ast.Name) and \
                    target.elts[0].id == variable and len(call.args) == 1 and \
                    not call.keywords:
                return True
    return False


def _ask_source(file: str, question: Callable[[str, str, str], bool], function: str,
                variable: str) -> bool | None:
    """``question(source, function, variable)`` of ``file``'s source; None when the source
    cannot be read or parsed."""
    source = "".join(linecache.getlines(file))
    if not source:
        return None
    try:
        return question(source, function, variable)
    except (SyntaxError, ValueError, RecursionError):
        return None


@functools.lru_cache(maxsize=64)
def counts_by_one(file: str, function: str, variable: str) -> bool | None:
    """Whether the source says ``variable`` steps by one in ``function`` (see
    _counts_by_one); None when the source cannot be read or parsed."""
    return _ask_source(file, _counts_by_one, function, variable)


@functools.lru_cache(maxsize=64)
def loop_variable(file: str, function: str, variable: str) -> bool | None:
    """Whether the source says ``variable`` counts a loop in ``function`` (see
    _assigned_by_loop); None when the source cannot be read or parsed."""
    return _ask_source(file, _assigned_by_loop, function, variable)


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
        rate = advanced / seconds if seconds > 0 else None
        found.append({"where": _where(loop["function"], loop["file"], loop["line"]),
                      "variable": loop["variable"], "advanced": advanced,
                      "restarts": restarts, "last": loop["last"][1], "rate_per_s": rate,
                      "observations": int(loop["observations"]),
                      "by_one": counts_by_one(loop["file"], loop["function"],
                                              loop["variable"]),
                      **_pass(loop, rate)})
    found.sort(key=lambda loop: loop["advanced"], reverse=True)
    return found[:TOP]


def _pass(loop: dict[str, Any], rate: float | None) -> dict[str, Any]:
    """Where a loop's current pass stands: its ``for`` line, its end, the phase and
    module it was last read in, its pace in this pass (the whole run's when the pass has
    one reading) and the seconds left to its end at that pace."""
    source = for_loop(loop["file"], loop["function"], loop["variable"])
    (entry_t, entry_value), (last_t, last_value) = loop.get("entry") or loop["first"], \
        loop["last"]
    pace = (last_value - entry_value) / (last_t - entry_t) \
        if last_t > entry_t and last_value > entry_value else rate
    end = loop.get("end")
    left = end - last_value if isinstance(end, int) else None
    return {"file": loop["file"], "function": loop["function"],
            "for_line": source.line if source else None, "end": end,
            "phase": loop.get("phase"), "module": loop.get("module"),
            "pass_rate_per_s": pace,
            "eta_s": left / pace if left is not None and left >= 0 and pace else None}


def _harness(file: str) -> bool:
    """nsadiag's own frames (its work count's dispatch mode included) and the
    interpreter's start-up ("<frozen runpy>")."""
    return "/nsadiag/" in file or file.startswith("<") or bool(INSTRUMENTATION_PATH.search(file))


def _frames(stacks: list[dict[str, Any]], samples: int) -> list[dict[str, Any]]:
    """Inclusive and self counts per (function, file, line), user code first (see the
    module docstring)."""
    inclusive: Counter = Counter()
    own: Counter = Counter()
    for entry in stacks:
        if entry.get("phase") == "build":
            continue
        count = int(entry.get("count", 0))
        frames = [tuple(frame) for frame in entry.get("frames", [])]
        for key in set(frames):
            inclusive[key] += count
        if frames:
            own[frames[-1]] += count
    rows = []
    for (function, file, line), count in inclusive.items():
        if _harness(file):
            continue
        mine = own.get((function, file, line), 0)
        rows.append({"where": _where(function, file, line), "function": function,
                     "file": file, "line": line, "user": is_user_file(file),
                     "inclusive": count, "self": mine,
                     "inclusive_share": count / samples if samples else 0.0,
                     "self_share": mine / samples if samples else 0.0})
    rows.sort(key=lambda row: (not row["user"], -row["inclusive"], -row["self"]))
    user = [row for row in rows if row["user"]][:TABLE_ROWS]
    rest = [row for row in rows if not row["user"]][:TABLE_ROWS]
    return user + rest


def _backward_counts(stacks: list[dict[str, Any]]) -> Counter:
    counts: Counter = Counter()
    for entry in stacks:
        if entry.get("phase") == "backward":
            counts[(entry.get("module"), entry.get("op"))] += int(entry.get("count", 0))
    return counts


def _backward_modules(stacks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    counts = _backward_counts(stacks)
    total = sum(counts.values())
    return [{"module": module, "op": op, "count": n, "share": n / total if total else 0.0}
            for (module, op), n in counts.most_common(2 * TOP)]


def _backward_by_module(stacks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    counts = _backward_counts(stacks)
    total = sum(counts.values())
    modules: Counter = Counter()
    for (module, _), n in counts.items():
        modules[module] += n
    rows = []
    for module, n in modules.most_common(TOP):
        ops = Counter({op: c for (m, op), c in counts.items() if m == module and op})
        op, in_op = ops.most_common(1)[0] if ops else (None, 0)
        rows.append({"module": module, "count": n, "share": n / total if total else 0.0,
                     "op": op, "op_share": in_op / total if total else 0.0})
    return rows


HOLDER_SHARE = 0.1
"""A frame holding less than this share of what the most holding frame holds is noise."""
CLOSE = 0.9
"""Scores within this factor of the best count as equal."""
MAJORITY = 0.5
"""A deeper frame holding more than this share of what the most holding frame holds is
named instead of it. The outermost frames hold everything, as they are on every stack; a
rise is given to the frames on the stack at both readings around it, so where readings are
sparse (a loaded machine) part of a line's memory falls to the frames around it only, and
the line may hold well under all of it. More than half can be held by one line of a
function only, so the frame named is still one. A deeper frame that holds more than all
the other frames at its depth together is named as well: resident memory rises where the
heap grows, so on a loaded machine the growth that kept tensors force often shows under
the backward or the optimizer step beside the line that keeps them (measured on
repro/scripts/loss_history_leak.py with four and eight burners: the validation line held
26-71 % of what its caller held, and more than the other lines of the loop together in 20
of 20 runs; the majority alone named the caller in 3 of the 6 runs with eight burners)."""


def _memory(ledger: dict[str, Any]) -> dict[str, Any]:
    """A memory ledger (nsadiag.probes.sampler.MemoryLedger.to_dict) and the frame that
    keeps the most of it across steps: among the frames that took memory in two steps or
    more and hold a real share of it, the one that gave back the least of what rose under
    it (held over risen: the outermost frames, on every stack, also saw everything that was
    given back), then the innermost of those holding more than MAJORITY of what the most
    holding one holds."""
    holders = [h for h in ledger.get("holders") or [] if int(h.get("steps", 0)) >= 2]
    holder = None
    if holders:
        most = max(int(h["held"]) for h in holders)
        real = [h for h in holders if int(h["held"]) >= HOLDER_SHARE * most]

        def kept(h: dict[str, Any]) -> float:
            return int(h["held"]) / max(int(h["rose"]), 1)

        best = max(kept(h) for h in real)
        close = [h for h in real if kept(h) >= CLOSE * best]
        largest = max(int(h["held"]) for h in close)

        def dominant(h: dict[str, Any]) -> bool:
            # more than every other line at its depth together: the lines beside it that
            # gave back most of what rose under them (a backward, an optimizer step) took
            # heap growth the kept memory pushed onto them, not memory of their own
            depth = int(h.get("depth", 0))
            beside = sum(int(o["held"]) for o in holders
                         if o is not h and int(o.get("depth", 0)) == depth)
            return int(h["held"]) > beside

        chosen = max((h for h in close if int(h["held"]) > MAJORITY * largest or dominant(h)),
                     key=lambda h: (int(h.get("depth", 0)), int(h["held"])))
        function, file, line = chosen["frame"]
        holder = {"where": _where(function, file, line), "file": file, "line": line,
                  "code": linecache.getline(file, line).strip() or None,
                  "held": int(chosen["held"]), "steps": int(chosen["steps"])}
    return {"first": ledger.get("first"), "last": ledger.get("last"),
            "peak": ledger.get("peak"), "held": ledger.get("held"), "holder": holder}


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
            "phases": dict(phases),
            "held_off_s": dict(profile.get("held_off_s") or {}),
            "hot_lines": _hot_lines(stacks, samples, phases),
            "waiting_line": _waiting_line(stacks, samples),
            "loops": _loops(list(profile.get("loops", []))),
            "memory": {kind: _memory(ledger) for kind, ledger in
                       (profile.get("memory") or {}).items()},
            "backward_ops": [{"op": op, "count": n} for op, n in ops.most_common(TOP)],
            "frames": _frames(stacks, samples - phases.get("build", 0)),
            "backward_modules": _backward_modules(stacks),
            "backward_by_module": _backward_by_module(stacks),
            "regions": region_counts(stacks),
            "work": work_split(stacks)}


OPTIMIZER_FILE = "/torch/optim/"
DATA_FILE = "/torch/utils/data/"
MODULE_CALL = ("_call_impl", "_wrapped_call_impl")


def work_split(stacks: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the training samples (every phase but the build) went: in the DataLoader
    (frames under torch/utils/data/: the data classes judge those), in the backward
    (autograd running the graph), in an optimizer's step (frames under torch/optim/), in the
    forward of a module (under ``Module._call_impl``), or outside all of them; and the user
    line most of the samples outside stood at, with its count: work the model's own
    modules, backward and optimizer do not account for (a loss built outside the model, a
    data step in the loop)."""
    split: Counter = Counter()
    outside: Counter = Counter()
    for entry in stacks:
        phase = entry.get("phase") or "other"
        if phase == "build":
            continue
        count = int(entry.get("count", 0))
        frames = [tuple(frame) for frame in entry.get("frames", [])]
        if any(DATA_FILE in str(frame[1]) for frame in frames):
            split["data"] += count
        elif any(OPTIMIZER_FILE in str(frame[1]) for frame in frames):
            split["optimizer"] += count  # an optimizer's step runs in the backward's phase
        elif phase == "backward":
            split["backward"] += count
        elif any(frame[0] in MODULE_CALL for frame in frames):
            split["modules"] += count
        else:
            split["outside"] += count
            user = [frame for frame in frames if is_user_file(frame[1])]
            if user:
                outside[user[-1]] += count
    line = None
    if outside:
        (function, file, number), count = outside.most_common(1)[0]
        line = {"where": _where(function, file, number), "file": file, "line": number,
                "code": linecache.getline(file, number).strip() or None, "count": count}
    return {"of": sum(split.values()), **{k: split.get(k, 0) for k in
                                         ("data", "backward", "optimizer", "modules",
                                          "outside")},
            "outside_line": line}


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
    sentences = [f"sampled profile: {samples} stacks{over} ({split})" + _held_off(summary)]
    sentences += _line_sentences(summary, phases)
    ops = summary.get("backward_ops") or []
    in_backward = phases.get("backward", 0)
    if ops and ops[0]["count"] >= MIN_OP_SHARE * in_backward:
        sentences.append(f"busiest backward op: {ops[0]['op']} in "
                         f"{ops[0]['count'] / in_backward:.0%} of the backward samples")
    busiest = next((row for row in summary.get("backward_by_module") or []
                    if row["module"] is not None), None)
    if busiest is not None and busiest["share"] >= MIN_OP_SHARE:
        op = (f" (busiest op {busiest['op']}, {busiest['op_share']:.0%})" if busiest["op"]
              else "")
        sentences.append(f"in backward, {busiest['share']:.0%} of the samples fell in the "
                         f"backward of {busiest['module']}{op}")
    loops = summary.get("loops") or []
    if loops:
        loop = loops[0]
        rate = (f" at {loop['rate_per_s']:.1f}/s" if loop.get("rate_per_s") is not None
                else "")
        again = f", restarted {loop['restarts']} times" if loop["restarts"] else ""
        sentences.append(f"loop variable `{loop['variable']}` in {loop['where']} advanced "
                         f"{loop['advanced']}{rate}{again}: a loop iterating")
    return sentences


def _held_off(summary: dict[str, Any]) -> str:
    """The seconds no sample stands for, by phase, when there were any."""
    held = {phase: s for phase, s in (summary.get("held_off_s") or {}).items() if s >= 1}
    if not held:
        return ""
    parts = ", ".join(f"{s:.1f} s in {phase}" for phase, s in
                      sorted(held.items(), key=lambda item: -item[1]))
    return (f"; besides, the sampler was held off for {parts} while the main thread ran "
            f"native code that held the GIL: those seconds have no sample and are not in "
            f"these shares")


def _line_sentences(summary: dict[str, Any], phases: dict[str, int]) -> list[str]:
    """The hottest user line (on the CPU), and the line the samples fell on most while
    the main thread waited, when that is another story."""
    sentences = []
    hot = summary.get("hot_lines") or []
    line = hot[0] if hot else None
    if line is not None and line.get("on_cpu") == 0:
        line = None  # no user line ran on the CPU: none is hot
    if line is not None:
        code = f" `{line['code']}`" if line.get("code") else ""
        shares = []
        if phases.get("build") and "training_fraction" in line:
            shares.append(f"{line['training_fraction']:.0%} once the model was built")
        if len(phases) > 1 and line.get("phase_fraction") is not None:
            shares.append(f"{line['phase_fraction']:.0%} of the {line['phase']} samples")
        built = f" ({'; '.join(shares)})" if shares else ""
        sentences.append(f"hottest line of user code: {line['where']}{code} in "
                         f"{line['fraction']:.0%} of the samples{built}")
    waiting = summary.get("waiting_line")
    if waiting is not None:
        code = f" `{waiting['code']}`" if waiting.get("code") else ""
        sentences.append(f"most samples ({waiting['fraction']:.0%}) fell on "
                         f"{waiting['where']}{code}, where the main thread was off the CPU "
                         f"in {waiting['waiting']} of {waiting['count']}: a wait, not work")
    return sentences


def _share(value: float) -> str:
    return f"{value:.0%}"


def tables(summary: dict[str, Any] | None) -> list[str]:
    """Markdown lines: the frames by inclusive and self share (user code first) and the
    backward samples by module and op; [] without samples."""
    if not summary or not summary.get("samples"):
        return []
    samples = summary["samples"]
    over = f" over {summary['duration_s']:.0f} s" if summary.get("duration_s") else ""
    built = samples - (summary.get("phases") or {}).get("build", 0)
    lines = [f"Sampled profile ({samples} stacks{over}; {built} once the model was built, "
             f"which the shares are of): frames by inclusive share (on the stack) and self "
             f"share (innermost), the target's own code first.", "",
             "| frame | code | inclusive | self |", "|---|---|---|---|"]
    for row in summary.get("frames") or []:
        lines.append(f"| {row['where']} | {'user' if row['user'] else 'library'} | "
                     f"{_share(row['inclusive_share'])} | {_share(row['self_share'])} |")
    backward = summary.get("backward_modules") or []
    if backward:
        lines += ["", "Backward samples by the module whose backward ran and the op running "
                      "(op - where that backward was not instrumented):", "",
                  "| module | op | share of backward samples |", "|---|---|---|"]
        for row in backward:
            lines.append(f"| {row['module'] or '(no watched module)'} | {row['op'] or '-'} "
                         f"| {_share(row['share'])} |")
    return lines
