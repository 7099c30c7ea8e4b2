"""ckpt: does gradient checkpointing change the gradients, and which recompute differs?

Two copies of the target with the same weights, grad_ckpt off and on, one forward and
backward each on the same ids (no autocast). Then:

* Gradients: max abs difference per parameter (tolerance TOLERANCE * max(1, max |ref|)),
  shown per block; a parameter with a gradient in one model and none in the other differs.
* Recompute differential, on the checkpointed model: hooks on every module record each
  call, in the forward and again in the backward (where a forward call is checkpoint
  recomputation): the module that ran, a digest of its input tensors, input and output
  shapes, and a sample of its output; the NSA branch wrappers record each branch output
  (for "select" the block indices). Recompute calls are matched by module identity: a
  recompute of module M is the twin of M's own forward call that received the same input,
  and then a different output or shape means the recompute is not exact. A recompute of M
  whose input none of M's forward calls received is one of two things. When another
  module N of the same kind received that input in the forward and N's forward was not
  replayed with it, the recompute ran M's parameters where N's belonged ("recompute of
  blocks.0 ran blocks.3's parameters", the late-bound closure). Otherwise M's input
  itself differs from its forward's: several Linears fed the same tensor (W_Q, W_K, W_V)
  each have their own twin, so one of them receiving another's forward input says only
  that its own input changed. Branch outputs are matched by name and occurrence. The
  first difference in forward order is the finding.

The tensors a checkpointed segment saves are rebuilt from its input by its modules, so a
module call whose input, output and shapes match its forward rebuilt them; the saved
tensors themselves are out of reach (checkpointing installs its own saved-tensor hooks
and only the innermost hooks apply). A non-reentrant recompute stops as soon as the
saved tensors are rebuilt, so some recompute calls have no output: those are matched by
input only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nsadiag.checks import TOLERANCE, CheckResult, finding, not_applicable
from nsadiag.checks.compare import difference, model_device, random_ids
from nsadiag.harness.heartbeat import HeartbeatWriter, hook_modules
from nsadiag.spec import TrialSpec
from nsadiag.targets import Target, factory_kwargs, load_factory, resolve

SAMPLE = 1 << 16  # output elements kept per call
MAX_ROWS = 12


@dataclass
class Call:
    """One module (or NSA branch) call, in the forward or in the backward's recompute."""

    module: str
    kind: str
    phase: str
    order: int
    key: str | None = None
    ident: int | None = None  # id() of the module object; None for a branch output
    parent: int | None = None  # order of the enclosing module call, if any
    in_shapes: list[list[int]] = field(default_factory=list)
    out_shapes: list[list[int]] | None = None
    sample: torch.Tensor | None = None


class Recorder:
    """Forward pre/post hooks on every submodule; `phase` says which pass is running."""

    def __init__(self, model: nn.Module):
        self.phase = "forward"
        self.calls: list[Call] = []
        self._open: list[Call] = []
        self._handles = []
        for name, module in model.named_modules():
            if name:
                self._handles.append(module.register_forward_pre_hook(self._enter(name)))
                self._handles.append(module.register_forward_hook(self._exit,
                                                                  always_call=True))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _enter(self, name: str):
        def hook(module: nn.Module, args: Any) -> None:
            tensors = _tensors(args)
            call = Call(name, type(module).__name__, self.phase, len(self.calls),
                        key=_digest(tensors), ident=id(module),
                        in_shapes=[list(t.shape) for t in tensors],
                        parent=self._open[-1].order if self._open else None)
            self.calls.append(call)
            self._open.append(call)
        return hook

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        call = self._open.pop() if self._open else None
        if call is None or output is None:  # a recompute stopped early: no output
            return
        tensors = _tensors(output)
        call.out_shapes = [list(t.shape) for t in tensors]
        call.sample = _sample(tensors[0]) if tensors else None

    def branch(self, name: str, output: torch.Tensor) -> None:
        """nsadiag.targets.BranchProbe's record callback."""
        self.calls.append(Call(name, "branch", self.phase, len(self.calls),
                               out_shapes=[list(output.shape)], sample=_sample(output)))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _digest(tensors: list[torch.Tensor]) -> str | None:
    if not tensors:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for tensor in tensors:
        flat = tensor.detach().contiguous().cpu()
        digest.update(f"{flat.dtype}{list(flat.shape)}".encode())
        digest.update(flat.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _sample(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    if flat.numel() > SAMPLE:
        flat = flat[:: flat.numel() // SAMPLE][:SAMPLE]
    return flat.cpu().clone() if not flat.is_floating_point() else flat.float().cpu().clone()


def measure(spec: TrialSpec, writer: HeartbeatWriter) -> CheckResult:
    refused = _cannot_checkpoint(spec)
    if refused:
        return not_applicable("ckpt", refused)
    warm_up_checkpoint()
    torch.manual_seed(spec.seed)
    plain = resolve(spec.replace(grad_ckpt=False))
    ckpt = resolve(spec.replace(grad_ckpt=True))
    ckpt.model.load_state_dict(plain.model.state_dict())
    ids = random_ids(plain.vocab_size, spec.batch, spec.seq_len + 1, spec.seed,
                     model_device(plain.model))
    # the same RNG state for both runs: dropout draws the same masks (recompute restores it)
    torch.manual_seed(spec.seed)
    with hook_modules(plain, writer):
        reference = gradients(plain, ids, writer, None)
    recorder = Recorder(ckpt.model)
    torch.manual_seed(spec.seed)
    try:
        with hook_modules(ckpt, writer, record=recorder.branch):
            got = gradients(ckpt, ids, writer, recorder)
    finally:
        recorder.remove()
    grad_rows = compare_gradients(ckpt, got, reference)
    return judge(grad_rows, recompute_differences(recorder.calls), recorder.calls)


def warm_up_checkpoint() -> None:
    """The first torch.utils.checkpoint call imports for seconds without any module event;
    make it here, during the start-up the runner allows for, not inside the watched step."""
    from torch.utils.checkpoint import checkpoint

    x = torch.ones(1, requires_grad=True)
    checkpoint(torch.mul, x, x, use_reentrant=False).backward()


def _cannot_checkpoint(spec: TrialSpec) -> str | None:
    if spec.target == "nsa":
        return None
    try:
        factory_kwargs(spec.replace(grad_ckpt=True), load_factory(spec.target),
                       torch.device("cpu"))
    except ValueError as exc:
        return f"gradient checkpointing cannot be switched on: {exc}"
    return None


def gradients(target: Target, ids: torch.Tensor, writer: HeartbeatWriter,
              recorder: Recorder | None) -> dict[str, torch.Tensor | None]:
    """{parameter name: gradient or None} of one forward and backward."""
    writer.start("forward", 0)
    loss = target.loss(ids)
    writer.start("backward", 0)
    if recorder is not None:
        recorder.phase = "recompute"
    loss.backward()
    return {name: None if p.grad is None else p.grad.detach().clone()
            for name, p in target.model.named_parameters()}


def compare_gradients(target: Target, got: dict[str, Any],
                      reference: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per block (and per parameter outside the blocks): the worst parameter."""
    blocks = [name for name, _ in target.blocks]
    groups: dict[str, list[str]] = {}
    for name in reference:
        owner = next((b for b in blocks if name.startswith(b + ".")), name)
        groups.setdefault(owner, []).append(name)
    rows = []
    for owner, names in groups.items():
        diffs = {n: difference(got[n], reference[n]) for n in names}
        worst = max(names, key=lambda n: diffs[n].err / diffs[n].tol)
        missing = [n for n in names if (got[n] is None) != (reference[n] is None)]
        detail = f"{worst}" + (f"; no gradient with checkpointing: {', '.join(missing)}"
                               if missing and got[missing[0]] is None else "")
        rows.append({"part": "gradients", "module": owner, "detail": detail,
                     "max abs err": diffs[worst].err, "tol": diffs[worst].tol,
                     "ok": all(d.ok for d in diffs.values()) and not missing})
    return rows


def recompute_differences(calls: list[Call]) -> list[tuple[int, dict[str, Any]]]:
    """(forward order, row) for every recompute call that differs from its forward, each
    recompute matched by module identity (see the module docstring)."""
    forward = [c for c in calls if c.phase == "forward"]
    recompute = [c for c in calls if c.phase == "recompute"]
    own: dict[int | None, list[Call]] = {}
    for call in forward:
        own.setdefault(call.ident, []).append(call)
    replayed = {(c.ident, c.key) for c in recompute if c.kind != "branch"}
    found: list[tuple[int, dict[str, Any]]] = []
    branch_seen: dict[str, int] = {}
    matched: dict[int, Call] = {}  # recompute call order -> its forward twin (same module)
    reported: set[int] = set()  # recompute calls already found to differ
    for call in recompute:
        if call.kind == "branch":
            k = branch_seen.get(call.module, 0)
            branch_seen[call.module] = k + 1
            twins = [c for c in forward if c.module == call.module]
            if k < len(twins):
                row = _differs(twins[k], call)
                if row:
                    found.append((twins[k].order, row))
            continue
        same = next((c for c in own.get(call.ident, []) if c.key == call.key), None)
        if same is not None:
            matched[call.order] = same
            row = _differs(same, call)
            if row:
                found.append((same.order, row))
                reported.add(call.order)
            continue
        reported.add(call.order)
        # another module's forward input, where that module's own forward was not replayed
        alike = next((c for c in forward if c.key == call.key and c.kind == call.kind
                      and c.ident != call.ident and (c.ident, c.key) not in replayed), None)
        if alike is not None:
            found.append((alike.order, _row(alike.module, f"recompute of {alike.module} ran "
                                            f"{call.module}'s parameters (same input as "
                                            f"{alike.module}'s forward)", None)))
            continue
        outer = _outermost_recompute(call, calls)
        if outer is not None and outer.order in reported:
            continue  # a consequence of the enclosing call's difference, already listed
        twin = matched.get(outer.order) if outer is not None else None
        received = ("an input its own forward did not receive" if own.get(call.ident)
                    else "an input no forward call received")
        if twin is not None:  # the enclosing call started alike and diverged inside
            found.append((twin.order, _row(twin.module, f"recompute of {twin.module} diverged "
                                           f"from its forward: inside it, {call.module} "
                                           f"received {received}", None)))
        elif own.get(call.ident):
            first = own[call.ident][0]
            found.append((first.order, _row(call.module, f"recompute of {call.module} "
                                            f"received {received}", None)))
        else:
            found.append((len(calls) + call.order, _row(
                call.module, f"recompute of {call.module} received {received}", None)))
    return sorted(found, key=lambda item: item[0])


def _outermost_recompute(call: Call, calls: list[Call]) -> Call | None:
    """The outermost recompute call enclosing `call` (the checkpointed segment's module)."""
    outer = None
    while call.parent is not None and calls[call.parent].phase == "recompute":
        call = outer = calls[call.parent]
    return outer


def _differs(before: Call, again: Call) -> dict[str, Any] | None:
    if again.out_shapes is None or before.out_shapes is None:
        return None  # stopped early: the input matched, nothing more to compare
    if again.out_shapes != before.out_shapes:
        return _row(before.module, f"recompute of {before.module} returned shapes "
                                   f"{again.out_shapes}, the forward {before.out_shapes}", None)
    if before.sample is None or again.sample is None:
        return None
    if not before.sample.is_floating_point():  # block indices: exact
        changed = int((before.sample != again.sample).sum())
        if changed:
            return _row(before.module, f"recompute of {before.module} chose other blocks "
                                       f"than its forward ({changed} of "
                                       f"{before.sample.numel()} indices differ)", None)
        return None
    diff = difference(again.sample, before.sample)
    if diff.ok:
        return None
    return _row(before.module, f"recompute of {before.module} produced a different output "
                               f"than its forward", diff)


def _row(module: str, detail: str, diff) -> dict[str, Any]:
    return {"part": "recompute", "module": module, "detail": detail,
            "max abs err": None if diff is None else diff.err,
            "tol": None if diff is None else diff.tol, "ok": False}


def judge(grad_rows: list[dict[str, Any]], differences: list[tuple[int, dict[str, Any]]],
          calls: list[Call]) -> CheckResult:
    recomputed = sum(c.phase == "recompute" and c.kind != "branch" for c in calls)
    bad_grads = [r for r in grad_rows if not r["ok"]]
    worst = max(grad_rows, key=lambda r: r["max abs err"] / r["tol"]) if grad_rows else None
    grads_text = (f"{len(bad_grads)} of {len(grad_rows)} gradient groups differ (worst "
                  f"{worst['module']}: {worst['max abs err']:.3g}, tol {worst['tol']:.3g})"
                  if bad_grads else f"gradients with and without checkpointing agree within "
                  f"{TOLERANCE:g} relative (worst {worst['max abs err']:.3g})" if worst else
                  "no parameters")
    rows = [row for _, row in differences[:MAX_ROWS]] + grad_rows
    if differences:
        first = differences[0][1]
        summary = (f"{first['detail']}; {len(differences)} recompute call(s) of "
                   f"{recomputed} differ; {grads_text}")
        return finding("ckpt", False, first["module"], summary, rows,
                       recomputed_calls=recomputed)
    if bad_grads:
        summary = (f"every recompute matched its forward ({recomputed} module calls), but "
                   f"{grads_text}")
        return finding("ckpt", False, bad_grads[0]["module"], summary, rows,
                       recomputed_calls=recomputed)
    if recomputed == 0:
        return finding("ckpt", True, None, f"not applicable: with grad_ckpt on, no module "
                       f"ran again during backward (the target does not checkpoint); "
                       f"{grads_text}", rows, applicable=False)
    summary = f"{recomputed} recomputed module calls matched their forward; {grads_text}"
    return finding("ckpt", True, None, summary, rows, recomputed_calls=recomputed)
