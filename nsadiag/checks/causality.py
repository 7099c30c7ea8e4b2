"""causality: nothing at a position before t may depend on a token at or after t.

Two forwards without gradients on the same weights: ids [B, S], and the same ids with every
token at positions >= t = S // 2 replaced by a different one. Forward hooks keep each
block's output, and the NSA branch wrappers (nsadiag.targets.BranchProbe) each branch's
output, all [B, S, ...] with time on dim 1, and the model's own output. A causal model
leaves rows < t unchanged (up to the fp32 tolerance; block indices exactly). The first block
in forward order whose rows < t changed is the finding; inside it, the first NSA branch
that changed ("blocks.1.attn.select": the selection looked ahead). A change only in the
model's output names "(outside the blocks)". The rows >= t must change, or the check says
that the perturbation reached nothing (the model ignores its input there).

The model runs in eval mode, so dropout cannot fake a leak.

A leak can hide below a length: a sliding window of w keys handled in chunks of w, say,
whose chunk boundary reads one key too far shows only once S exceeds w. So after a pass
at spec.seq_len finds nothing, the check runs a second pass at a longer length L (batch
1, the target built anew at that length), where the budget allows (``plan_long_pass``):
the first of LONG_FACTOR x S and 2 x S (each at least LONG_MIN_TOKENS / LONG_FACTOR x 2,
so a short S still reaches past common windows) whose predicted time (the first pass's,
grown with the square of the length, with a margin) and memory (the first pass's growth
of the peak, grown alike) fit what is left of the budget and of the machine's memory. A
second pass that cannot run (a model with a maximum length, say) is reported, never
turned into a failure.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import psutil
import torch

from nsadiag.checks import CheckResult, finding
from nsadiag.checks.compare import difference, model_device, random_ids
from nsadiag.fmt import gib
from nsadiag.harness.heartbeat import HeartbeatWriter, hook_modules
from nsadiag.spec import TrialSpec
from nsadiag.targets import Target, resolve

OUTPUT = "(model output)"
LONG_FACTOR = 4
LONG_MIN_TOKENS = 4096
"""The second pass runs at LONG_FACTOR x S, and at least this many tokens (2 x S and half
as many when that does not fit): past the paper's window of 512 and longer ones."""
TIME_MARGIN = 1.5
"""The second pass's predicted time is the first's, scaled with the square of the length
(attention's cost; a linear-cost model takes less), times this."""
RESERVE_S = 10.0
"""Budget kept after the second pass: writing the result and exiting, on a busy machine."""
MEMORY_SHARE = 0.5
"""The second pass may grow the peak by at most this share of the memory available."""


def measure(spec: TrialSpec, writer: HeartbeatWriter,
            deadline: float | None = None) -> CheckResult:
    """The check (see the module docstring). ``deadline`` is the unix time the budget ends
    (default: this process's start plus spec.budget_s, as the runner counts it)."""
    if spec.seq_len < 2:
        raise ValueError(f"seq_len: the causality check needs at least 2 tokens, "
                         f"got {spec.seq_len}")
    if deadline is None:
        deadline = psutil.Process().create_time() + spec.budget_s
    started = time.monotonic()
    target = resolve(spec)
    built_s = time.monotonic() - started
    peak_before = _peak_rss()
    started = time.monotonic()
    first = one_pass(target, spec.seq_len, spec.batch, spec.seed, writer, 0)
    pass_s = time.monotonic() - started
    if not first.passed:
        return first
    length, why_not = plan_long_pass(
        spec.seq_len, spec.batch, built_s, pass_s, _peak_rss() - peak_before,
        deadline - time.time(), _memory_available(spec.memory_cap_bytes))
    if length is None:
        return _with_second(first, f"no second pass at a longer length: {why_not}", [],
                            long_seq_len=None)
    try:
        long_target = resolve(spec.replace(seq_len=length, batch=1))
        second = one_pass(long_target, length, 1, spec.seed, writer, 2)
    except Exception as exc:  # the length may be beyond the model: that is no leak
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _with_second(first, f"the second pass at S={length} could not run "
                                   f"({type(exc).__name__}: {message})", [],
                            long_seq_len=None)
    if not second.passed:
        return finding("causality", False, second.module,
                       f"at S={length}, the second pass (S={spec.seq_len} showed nothing): "
                       f"{second.summary}", first.table + second.table,
                       t=second.verdict.facts.check.figures.get("t"), long_seq_len=length)
    return _with_second(first, f"again at S={length}: {second.summary.split('; ')[0]}",
                        second.table, long_seq_len=length)


def _with_second(first: CheckResult, sentence: str, rows: list[dict[str, Any]],
                 **facts: Any) -> CheckResult:
    """The first pass's passing result, with what the second pass did."""
    kept = {k: v for k, v in first.verdict.facts.to_dict().items() if k not in ("check", "module")}
    return finding("causality", True, None, f"{first.summary}; {sentence}",
                   first.table + rows, **{**kept, **facts})


def _peak_rss() -> int:
    """This process's peak resident memory so far, bytes (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _memory_available(cap_bytes: int | None) -> int:
    """Memory the second pass may use: what the machine has available, and below the
    runner's address-space cap when one is set."""
    available = psutil.virtual_memory().available
    if cap_bytes:
        used = psutil.Process().memory_info().vms
        available = min(available, max(0, cap_bytes - used))
    return available


def plan_long_pass(seq_len: int, batch: int, built_s: float, pass_s: float, grown_bytes: int,
                   left_s: float, available_bytes: int) -> tuple[int | None, str | None]:
    """(the second pass's length, None), or (None, why it does not run): the longest of
    the candidate lengths (see the module docstring) whose predicted time fits ``left_s``
    less RESERVE_S and whose predicted growth of the peak fits MEMORY_SHARE of
    ``available_bytes``. ``pass_s`` and ``grown_bytes`` are the first pass's time and
    growth of the peak at ``seq_len`` with ``batch`` rows; the second pass has one row
    and builds the model again (``built_s``)."""
    candidates = sorted({max(LONG_FACTOR * seq_len, LONG_MIN_TOKENS),
                         max(2 * seq_len, LONG_MIN_TOKENS // 2)}, reverse=True)
    reasons = []
    for length in candidates:
        scale = (length / seq_len) ** 2 / max(1, batch)
        need_s = built_s + pass_s * scale * TIME_MARGIN
        need_bytes = max(0, grown_bytes) * scale
        if need_s > left_s - RESERVE_S:
            reasons.append(f"S={length} would take about {need_s:.0f} s, "
                           f"{max(0.0, left_s):.0f} s of the budget are left")
        elif need_bytes > MEMORY_SHARE * available_bytes:
            reasons.append(f"S={length} would need about {gib(need_bytes, '.1f')} more, "
                           f"{gib(available_bytes, '.1f')} are available")
        else:
            return length, None
    return None, "; ".join(reasons)


def one_pass(target: Target, seq_len: int, batch: int, seed: int, writer: HeartbeatWriter,
             step: int) -> CheckResult:
    """Two forwards at ``seq_len`` (clean, then with tokens >= seq_len // 2 perturbed),
    judged; the heartbeat calls them steps ``step`` and ``step + 1``."""
    target.model.eval()
    t = seq_len // 2
    device = model_device(target.model)
    ids = random_ids(target.vocab_size, batch, seq_len, seed, device)
    shift = random_ids(target.vocab_size - 1, batch, seq_len - t, seed + 1, device) + 1
    perturbed = ids.clone()
    perturbed[:, t:] = (ids[:, t:] + shift) % target.vocab_size
    writer.start("forward", step)
    clean = outputs_of(target, ids, writer)
    writer.start("forward", step + 1)
    dirty = outputs_of(target, perturbed, writer)
    return judge(target, clean, dirty, t, seq_len)


def outputs_of(target: Target, ids: torch.Tensor, writer: HeartbeatWriter) -> dict[str, Any]:
    """{name: output} of every block and NSA branch, in the order they finished."""
    outputs: dict[str, Any] = {}

    def keep(name: str):
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            outputs[name] = _tensor(output)
        return hook

    handles = [block.register_forward_hook(keep(name)) for name, block in target.blocks]
    try:
        with hook_modules(target, writer,
                          record=lambda name, out: outputs.__setitem__(name, out)), \
                torch.no_grad():
            outputs[OUTPUT] = _tensor(target.model(ids))
    finally:
        for handle in handles:
            handle.remove()
    return {name: value.detach().clone() if isinstance(value, torch.Tensor) else None
            for name, value in outputs.items()}


def _tensor(output: Any) -> torch.Tensor | None:
    first = output[0] if isinstance(output, (tuple, list)) and output else output
    return first if isinstance(first, torch.Tensor) else None


def judge(target: Target, clean: dict[str, Any], dirty: dict[str, Any], t: int,
          seq_len: int) -> CheckResult:
    rows, changed = [], []
    for name, before in clean.items():
        after = dirty.get(name)
        if not _has_time_axis(before, seq_len) or not _has_time_axis(after, seq_len):
            continue
        past = difference(after[:, :t], before[:, :t])
        if before.dtype in (torch.int64, torch.int32):  # block indices: exact
            past.tol = 0.0
        rows.append({"S": seq_len, "module": name, "max abs diff before t": past.err,
                     "tol": past.tol, "changed": not past.ok})
        if not past.ok:
            changed.append(name)
    future = difference(dirty[OUTPUT][:, t:], clean[OUTPUT][:, t:]) if _has_time_axis(
        clean.get(OUTPUT), seq_len) else None
    reached = future is not None and not future.ok
    blocks = [name for name, _ in target.blocks]
    where = _first_leak(blocks, changed)
    n_blocks = sum(r["module"] in blocks for r in rows)
    n_branches = sum(r["module"] not in blocks and r["module"] != OUTPUT for r in rows)
    if where is None:
        worst = max((r["max abs diff before t"] for r in rows), default=0.0)
        tail = (f"outputs at >= {t} changed by up to {future.err:.3g}" if reached else
                "the outputs at >= t did not change either: the perturbation reached nothing")
        summary = (f"perturbing tokens >= {t} of {seq_len} left every output before {t} "
                   f"unchanged (max abs diff {worst:.3g} over {n_blocks} blocks and "
                   f"{n_branches} branch outputs); {tail}")
        return finding("causality", True, None, summary, rows, t=t, reached_future=reached)
    row = next(r for r in rows if r["module"] == where)
    summary = (f"perturbing tokens >= {t} of {seq_len} changed {where}'s output before "
               f"position {t} (max abs diff {row['max abs diff before t']:.3g} > tol "
               f"{row['tol']:.3g}): it reads tokens from the future")
    return finding("causality", False, where, summary, rows, t=t)


def _has_time_axis(value: Any, seq_len: int) -> bool:
    return isinstance(value, torch.Tensor) and value.ndim >= 2 and value.shape[1] == seq_len


def _first_leak(blocks: list[str], changed: list[str]) -> str | None:
    """The first changed block, refined to its first changed branch; else the output."""
    for block in blocks:
        if block in changed:
            inside = [name for name in changed if name.startswith(block + ".")]
            return inside[0] if inside else block
        inside = [name for name in changed if name.startswith(block + ".")]
        if inside:  # a branch changed although its block's output did not (gated to ~0)
            return inside[0]
    return "(outside the blocks)" if changed else None
