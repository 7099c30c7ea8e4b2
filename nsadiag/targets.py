"""Target resolution: turn a TrialSpec into a model, its loss, and the pieces to watch.

Two kinds of target:

* "nsa" builds `nsa.model.NSATransformer(NSAConfig().replace(**overrides, **knobs))`, the
  knobs being the spec's n_layers, grad_ckpt, branches, backend and dtype (only those the
  spec sets). NSAConfig's ValueError, which names the field, passes through unchanged.
* "pkg.module:factory" imports the module and calls the factory with the keyword arguments
  it declares among the spec knobs (n_layers, seq_len, grad_ckpt, dtype, device, branches,
  backend, seed) plus every override. A spec that asks for a knob the factory does not
  declare (n_layers or branches or backend set, grad_ckpt true) raises ValueError naming
  the knob and listing what the factory accepts. dtype, device and seed are honoured by the
  trial itself (autocast, `.to(device)`, seeding) when the factory does not take them.

The model's forward takes ids [B, S] and returns logits [B, S, V] (the loss is next-token
cross entropy) or a scalar loss. `Target.loss(ids)` takes ids [B, S + 1]. Blocks are the
children of the largest nn.ModuleList in the model (top-level children when there is none).

Watching NSA branches. NSAAttention computes its three branches inside `_mix_branches` by
calling functions (custom autograd Functions), not submodules, so module hooks cannot see
them and `nsa/` must not be edited for diagnostics. `instrument_branches` therefore
replaces the names `compressed_attention`, `selected_attention`, `window_attention` and
`select_blocks` in the `nsa.layer` module namespace (where `_mix_branches` looks them up at
call time) with wrappers, in the trial process only, and restores them on removal. Forward
pre/post hooks on each NSAAttention module record which layer is running, so a wrapper
knows its event name, e.g. "blocks.3.attn.sel". Each wrapper emits:

* forward enter/exit around the call;
* backward enter from a hook on the branch output (`Tensor.register_hook` fires when the
  gradient of the output arrives, i.e. just before the branch's backward runs);
* backward exit from a tiny identity autograd Function applied to the branch's
  differentiable inputs: its backward runs once the branch's backward has produced the
  input gradients, i.e. just after the branch's backward finished.

`select_blocks` returns integer indices (not differentiable), so "select" has forward
events only. Under gradient checkpointing the recompute re-runs the wrappers, so forward
events of a block also appear inside the step's backward phase, and the recompute's forward
exit may be missing (non-reentrant checkpoint stops recomputing once the saved tensors are
rebuilt); the backward hooks of the recomputed graph never fire.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nsadiag.builtin import nsa_attention_class, require_builtin_nsa
from nsadiag.spec import TrialSpec

Emit = Callable[[str, str, str], None]  # (module name, "forward" | "backward", "enter" | "exit")
Record = Callable[[str, torch.Tensor], None]  # (branch event name, the branch's output)
FACTORY_KNOBS = ("n_layers", "seq_len", "grad_ckpt", "dtype", "device", "branches", "backend",
                 "seed")
# (name in nsa.layer, event suffix, differentiable)
NSA_BRANCH_FUNCTIONS = (
    ("compressed_attention", "cmp", True),
    ("select_blocks", "select", False),
    ("selected_attention", "sel", True),
    ("window_attention", "win", True),
)


@dataclass
class Target:
    """A resolved target, already on its device and in training mode.

    model        the nn.Module to train
    loss         ids [B, S + 1] int64 -> scalar loss tensor
    blocks       (dotted name, module) of the repeated blocks, in forward order
    branches     (event name, owning NSAAttention) of each attention branch event, e.g.
                 ("blocks.0.attn.cmp", attn); empty when the model has no NSAAttention
    description  one line for reports
    vocab_size   token ids are drawn from [0, vocab_size)
    """

    model: nn.Module
    loss: Callable[[torch.Tensor], torch.Tensor]
    blocks: list[tuple[str, nn.Module]]
    branches: list[tuple[str, nn.Module]]
    description: str
    vocab_size: int


def resolve(spec: TrialSpec) -> Target:
    """Build the spec's target on the spec's device (see the module docstring)."""
    device = resolve_device(spec.device)
    if spec.target == "nsa":
        model, description = _build_nsa(spec)
    else:
        model, description = _build_factory(spec, device)
    model = model.to(device).train()
    return Target(model=model, loss=_next_token_loss(model), blocks=find_blocks(model),
                  branches=find_branches(model), description=description,
                  vocab_size=_vocab_size(model, spec.target))


def resolve_device(name: str) -> torch.device:
    """"cpu" | "cuda" | "auto" -> a torch.device; "cuda" without CUDA raises ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but torch.cuda.is_available() is False; "
                         "use cpu or auto")
    return torch.device(name)


def _build_nsa(spec: TrialSpec) -> tuple[nn.Module, str]:
    require_builtin_nsa()
    from nsa.config import NSAConfig
    from nsa.model import NSATransformer

    knobs: dict[str, Any] = {"grad_ckpt": spec.grad_ckpt, "dtype": spec.dtype}
    for name in ("n_layers", "branches", "backend"):
        if getattr(spec, name) is not None:
            knobs[name] = getattr(spec, name)
    cfg = NSAConfig().replace(**spec.overrides, **knobs)
    description = (f"nsa: NSATransformer n_layers={cfg.n_layers} dim={cfg.dim} "
                   f"heads={cfg.n_heads}/{cfg.n_kv_heads}x{cfg.head_dim} l={cfg.l} d={cfg.d} "
                   f"l_sel={cfg.l_sel} n_sel={cfg.n_sel} w={cfg.w} "
                   f"branches={','.join(cfg.branches)} backend={cfg.backend} "
                   f"grad_ckpt={cfg.grad_ckpt} dtype={cfg.dtype}")
    return NSATransformer(cfg), description


def _build_factory(spec: TrialSpec, device: torch.device) -> tuple[nn.Module, str]:
    factory = load_factory(spec.target)
    kwargs = factory_kwargs(spec, factory, device)
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise ValueError(f"target: factory {spec.target} returned {type(model).__name__}, "
                         f"not a torch.nn.Module")
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return model, f"{spec.target}({shown}): {type(model).__name__}"


class TargetImportError(ValueError):
    """The target's module was found but failed while being imported: it raised, or it
    called sys.exit(). The user's code failed, not the command line."""


def load_factory(target: str) -> Callable[..., Any]:
    """"pkg.module:factory" -> the callable. One-line ValueError when the module or the
    factory does not exist; TargetImportError naming what happened when importing the
    module raised or called sys.exit() (SystemExit never escapes: a target must not end
    the process that imports it with an exit code of its choosing)."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ValueError(f"target: cannot import {module_name!r}: {reason}") from None
        raise TargetImportError(f"target: importing {module_name!r} raised "
                                f"ModuleNotFoundError: {reason}") from exc
    except SystemExit as exc:
        raise TargetImportError(f"target: importing {module_name!r} called "
                                f"sys.exit({exc.code!r})") from None
    except Exception as exc:  # any import-time failure of user code is a target error
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise TargetImportError(f"target: importing {module_name!r} raised "
                                f"{type(exc).__name__}: {reason}".rstrip(": ")) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"target: {module_name!r} has no callable {attr!r}")
    return factory


def describe_target(spec: TrialSpec) -> dict[str, Any]:
    """What a target accepts, for a parent that must not import it (the "target" job of
    nsadiag.harness.child): {"accepts": the keyword parameters its factory declares,
    "open_ended": it takes **kwargs, "problem": the one-line ValueError the spec's knobs or
    overrides would raise, or None}. TargetImportError (the module failed while being
    imported) propagates."""
    try:
        factory = load_factory(spec.target)
    except TargetImportError:
        raise
    except ValueError as exc:  # no such module or factory: what the user typed
        return {"accepts": None, "problem": str(exc), "open_ended": False}
    params = inspect.signature(factory).parameters
    accepts = [name for name, p in params.items()
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    problem = None
    try:
        factory_kwargs(spec, factory, torch.device("cpu"))
    except ValueError as exc:
        problem = str(exc)
    return {"accepts": accepts, "problem": problem,
            "open_ended": any(p.kind == p.VAR_KEYWORD for p in params.values())}


def factory_kwargs(spec: TrialSpec, factory: Callable[..., Any],
                   device: torch.device) -> dict[str, Any]:
    """The keyword arguments to call `factory` with; ValueError for what it cannot take."""
    params = inspect.signature(factory).parameters
    accepts = [name for name, p in params.items()
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    open_ended = any(p.kind == p.VAR_KEYWORD for p in params.values())
    values = _knob_values(spec, device)
    kwargs = {name: value for name, value in values.items() if name in accepts}
    for name in _asked_knobs(spec):
        if name not in accepts:
            _refuse(spec.target, name, accepts)
    for name, value in spec.overrides.items():
        if name not in accepts and not open_ended:
            _refuse(spec.target, name, accepts)
        kwargs[name] = value
    return kwargs


def _knob_values(spec: TrialSpec, device: torch.device) -> dict[str, Any]:
    values = {"n_layers": spec.n_layers, "seq_len": spec.seq_len, "grad_ckpt": spec.grad_ckpt,
              "dtype": spec.dtype, "device": str(device), "branches": spec.branches,
              "backend": spec.backend, "seed": spec.seed}
    return {name: value for name, value in values.items() if value is not None}


def _asked_knobs(spec: TrialSpec) -> list[str]:
    """Knobs the spec sets that only the factory itself can honour."""
    asked = [name for name in ("n_layers", "branches", "backend")
             if getattr(spec, name) is not None]
    return asked + (["grad_ckpt"] if spec.grad_ckpt else [])


def _refuse(target: str, name: str, accepts: list[str]) -> None:
    raise ValueError(f"target: factory {target} does not accept {name!r}; it accepts: "
                     f"{', '.join(accepts) or 'nothing'}")


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Children of the largest nn.ModuleList (first found wins ties), else top-level children."""
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return list(model.named_children())
    name, largest = max(lists, key=lambda item: len(item[1]))
    prefix = f"{name}." if name else ""
    return [(f"{prefix}{child_name}", child) for child_name, child in largest.named_children()]


def find_branches(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(event name, NSAAttention) for every branch event each NSAAttention emits; none
    when ``nsa`` on sys.path is not nsa-diag's (nsadiag.builtin)."""
    nsa_attention = nsa_attention_class()
    if nsa_attention is None:
        return []
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nsa_attention):
            suffixes = [s for _, s, _ in NSA_BRANCH_FUNCTIONS if _computes(module, s)]
            found += [(f"{name}.{suffix}", module) for suffix in suffixes]
    return found


def _computes(attn: nn.Module, suffix: str) -> bool:
    if attn.backend == "naive":  # the oracle path calls none of the wrapped functions
        return False
    return ("sel" if suffix == "select" else suffix) in attn.branches


def _next_token_loss(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    def loss(ids: torch.Tensor) -> torch.Tensor:
        """ids [B, S + 1] -> model(ids[:, :-1]) as a scalar, or CE against ids[:, 1:]."""
        out = model(ids[:, :-1])
        if not isinstance(out, torch.Tensor) or out.ndim not in (0, 3):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"target: forward must return logits [B, S, V] or a scalar loss, "
                             f"got {shape}")
        if out.ndim == 0:
            return out
        return F.cross_entropy(out.float().flatten(0, 1), ids[:, 1:].flatten())

    return loss


def _vocab_size(model: nn.Module, target: str) -> int:
    """model.vocab_size or model.cfg.vocab_size, else the first nn.Embedding's size."""
    for owner in (model, getattr(model, "cfg", None), getattr(model, "config", None)):
        value = getattr(owner, "vocab_size", None)
        if isinstance(value, int) and value > 0:
            return value
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    raise ValueError(f"target: cannot infer the vocabulary of {target}: give the model a "
                     f"vocab_size attribute or an nn.Embedding")


class _BackwardExit(torch.autograd.Function):
    """Identity on tensors whose backward calls `callback` (the branch backward is done)."""

    @staticmethod
    def forward(ctx, callback: Callable[[], None], *tensors: torch.Tensor):
        ctx.callback = callback
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.callback()
        return (None, *grads)


class BranchProbe:
    """The installed NSA branch wrappers and scope hooks; `remove()` undoes everything."""

    def __init__(self, model: nn.Module, emit: Emit, record: Record | None = None):
        from nsa import layer

        self._layer = layer
        self._emit = emit
        self._record = record
        self._scope: list[str] = []
        self._originals: dict[str, Callable[..., Any]] = {}
        self._handles = []
        for name, module in model.named_modules():
            if isinstance(module, layer.NSAAttention):
                self._handles.append(module.register_forward_pre_hook(self._enter(name)))
                # always_call: checkpoint recompute may stop early by raising inside forward
                self._handles.append(module.register_forward_hook(self._leave, always_call=True))
        for fn_name, suffix, differentiable in NSA_BRANCH_FUNCTIONS:
            original = getattr(layer, fn_name)
            if getattr(original, "__nsadiag_wrapped__", False):
                raise RuntimeError(f"nsa.layer.{fn_name} is already instrumented")
            self._originals[fn_name] = original
            setattr(layer, fn_name, self._wrap(original, suffix, differentiable))

    def remove(self) -> None:
        """Restore the original functions in nsa.layer and drop the scope hooks."""
        for fn_name, original in self._originals.items():
            setattr(self._layer, fn_name, original)
        self._originals.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _enter(self, name: str):
        def hook(module: nn.Module, args: Any) -> None:
            self._scope.append(name)
        return hook

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._scope:
            self._scope.pop()

    def _wrap(self, fn: Callable[..., Any], suffix: str, differentiable: bool):
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self._scope:  # called outside a watched NSAAttention
                return fn(*args, **kwargs)
            name = f"{self._scope[-1]}.{suffix}"
            self._emit(name, "forward", "enter")
            if differentiable and torch.is_grad_enabled():
                args = self._mark_inputs(name, args)
            out = fn(*args, **kwargs)
            if differentiable:
                self._mark_output(name, out[0] if isinstance(out, tuple) else out)
            if self._record is not None:
                self._record(name, out[0] if isinstance(out, tuple) else out)
            self._emit(name, "forward", "exit")
            return out

        wrapper.__nsadiag_wrapped__ = True  # type: ignore[attr-defined]
        return wrapper

    def _mark_inputs(self, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        if not slots:
            return args
        marked = _BackwardExit.apply(lambda: self._emit(name, "backward", "exit"),
                                     *(args[i] for i in slots))
        replaced = list(args)
        for i, tensor in zip(slots, marked, strict=True):
            replaced[i] = tensor
        return tuple(replaced)

    def _mark_output(self, name: str, out: torch.Tensor) -> None:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad: self._emit(name, "backward", "enter"))


def instrument_branches(target: Target, emit: Emit,
                        record: Record | None = None) -> BranchProbe | None:
    """Install the NSA branch wrappers when the target has NSA branches, else None.
    `record`, when given, also receives each branch call's output tensor (for "select":
    the block indices), in the forward and in checkpoint recomputes."""
    return BranchProbe(target.model, emit, record) if target.branches else None
