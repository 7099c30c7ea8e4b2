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
"""

from __future__ import annotations

from typing import Any

import torch

from nsadiag.checks import CheckResult, finding
from nsadiag.checks.compare import difference, model_device, random_ids
from nsadiag.harness.heartbeat import HeartbeatWriter, watch
from nsadiag.spec import TrialSpec
from nsadiag.targets import Target, resolve

OUTPUT = "(model output)"


def measure(spec: TrialSpec, writer: HeartbeatWriter) -> CheckResult:
    if spec.seq_len < 2:
        raise ValueError(f"seq_len: the causality check needs at least 2 tokens, "
                         f"got {spec.seq_len}")
    target = resolve(spec)
    target.model.eval()
    t = spec.seq_len // 2
    device = model_device(target.model)
    ids = random_ids(target.vocab_size, spec.batch, spec.seq_len, spec.seed, device)
    shift = random_ids(target.vocab_size - 1, spec.batch, spec.seq_len - t, spec.seed + 1,
                       device) + 1
    perturbed = ids.clone()
    perturbed[:, t:] = (ids[:, t:] + shift) % target.vocab_size
    writer.start("forward", 0)
    clean = outputs_of(target, ids, writer)
    writer.start("forward", 1)
    dirty = outputs_of(target, perturbed, writer)
    return judge(target, clean, dirty, t, spec.seq_len)


def outputs_of(target: Target, ids: torch.Tensor, writer: HeartbeatWriter) -> dict[str, Any]:
    """{name: output} of every block and NSA branch, in the order they finished."""
    outputs: dict[str, Any] = {}

    def keep(name: str):
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            outputs[name] = _tensor(output)
        return hook

    handles = [block.register_forward_hook(keep(name)) for name, block in target.blocks]
    try:
        with watch(target, writer, record=lambda name, out: outputs.__setitem__(name, out)), \
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
        rows.append({"module": name, "max abs diff before t": past.err, "tol": past.tol,
                     "changed": not past.ok})
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
