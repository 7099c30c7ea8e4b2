"""parity: every available NSA backend against the naive dense-mask oracle, in fp32.

For each NSAAttention layer of the target (found by type, so user models qualify too) the
check takes the input that layer receives in a real forward of the model, builds a naive
copy (`backend="naive"`) and one copy per other backend, all of the layer's own class with
its weights, and compares forward outputs and gradients (input and every parameter) under
one random output gradient. The tolerance is TOLERANCE * max(1, max |reference|).

Backends come from nsa.config.BACKENDS, so one added there is checked without naming it
here; "auto" is a routing choice, not an implementation, and is skipped. A backend is
available when NSAConfig validates with it, the layer builds on the device and its first
forward runs; a ValueError at any of those steps lists it as "not available: <message>".
A target without NSAAttention layers gets "not applicable", not a pass.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from nsadiag.builtin import nsa_attention_class
from nsadiag.checks import CheckResult, finding, not_applicable
from nsadiag.checks.compare import difference, model_device, random_ids
from nsadiag.harness.heartbeat import HeartbeatWriter, hook_modules
from nsadiag.spec import TrialSpec
from nsadiag.targets import Target, resolve

ORACLE = "naive"
NOT_IMPLEMENTATIONS = ("naive", "auto")


def measure(spec: TrialSpec, writer: HeartbeatWriter) -> CheckResult:
    target = resolve(spec)
    nsa_attention = nsa_attention_class()
    layers = [(name, m) for name, m in target.model.named_modules()
              if nsa_attention is not None and isinstance(m, nsa_attention)]
    if not layers:
        return not_applicable("parity", f"parity needs NSAAttention layers; "
                                        f"{target.description} has none")
    from nsa.config import BACKENDS

    inputs = layer_inputs(target, layers,
                          random_ids(target.vocab_size, spec.batch, spec.seq_len, spec.seed,
                                     model_device(target.model)), writer)
    backends = [b for b in BACKENDS if b not in NOT_IMPLEMENTATIONS]
    rows: list[dict[str, Any]] = []
    generator = torch.Generator().manual_seed(spec.seed)
    for name, layer in layers:
        x = inputs[name]
        grad_out = torch.randn(x.shape[:-1] + (layer.cfg.dim,), generator=generator).to(x.device)
        writer.start("backward", 0)
        reference = run_layer(copy_layer(layer, ORACLE), x, grad_out)
        writer.module(f"{name}[{ORACLE}]", "backward", "exit")
        for backend in backends:
            try:
                got = run_layer(copy_layer(layer, backend), x, grad_out)
            except ValueError as exc:
                rows.append(_row(name, backend, f"not available: {exc}", None))
                continue
            writer.module(f"{name}[{backend}]", "backward", "exit")
            rows += compare(name, backend, got, reference)
    return judge(rows, [name for name, _ in layers], backends)


def layer_inputs(target: Target, layers: list[tuple[str, nn.Module]], ids: torch.Tensor,
                 writer: HeartbeatWriter) -> dict[str, torch.Tensor]:
    """{layer name: its input [B, S, dim] in fp32} from one forward of the model."""
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: Any) -> None:
            seen.setdefault(name, args[0].detach().float().clone())
        return hook

    handles = [layer.register_forward_pre_hook(keep(name)) for name, layer in layers]
    writer.start("forward", 0)
    try:
        with hook_modules(target, writer), torch.no_grad():
            target.model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def copy_layer(layer: nn.Module, backend: str) -> nn.Module:
    """The layer's own class with `backend`, its weights, fp32, on its device."""
    cfg = layer.cfg.replace(backend=backend, dtype="float32").validate()
    twin = type(layer)(cfg)
    twin.load_state_dict(layer.state_dict())
    return twin.to(device=model_device(layer), dtype=torch.float32).train()


def run_layer(layer: nn.Module, x: torch.Tensor, grad_out: torch.Tensor) -> dict[str, Any]:
    """Output and gradients (input, each parameter) of layer(x) under grad_out."""
    x = x.clone().requires_grad_(True)
    out = layer(x)
    out.backward(grad_out)
    grads = {name: p.grad for name, p in layer.named_parameters()}
    return {"output": out.detach(), "grad input": x.grad, "grads": grads,
            "ran": getattr(layer, "backend_used", None)}


def compare(name: str, backend: str, got: dict[str, Any],
            reference: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows: output, input gradient, and the worst parameter gradient."""
    rows = [_row(name, backend, tensor, difference(got[tensor], reference[tensor]))
            for tensor in ("output", "grad input")]
    params = {p: difference(got["grads"][p], reference["grads"][p]) for p in reference["grads"]}
    if params:
        # a NaN error never compares greater: rank failures (NaN included) first
        worst = max(params, key=lambda p: (not params[p].ok, _ratio(params[p])))
        rows.append(_row(name, backend, f"grad {worst} (worst of {len(params)})",
                         params[worst]))
    return rows


def _ratio(diff) -> float:
    return math.inf if math.isnan(diff.err) else diff.err / diff.tol


def _row(module: str, backend: str, tensor: str, diff) -> dict[str, Any]:
    return {"module": module, "backend": backend, "tensor": tensor,
            "max abs err": None if diff is None else diff.err,
            "scale": None if diff is None else diff.scale,
            "tol": None if diff is None else diff.tol,
            "ok": None if diff is None else diff.ok}


def judge(rows: list[dict[str, Any]], layers: list[str], backends: list[str]) -> CheckResult:
    failed = [r for r in rows if r["ok"] is False]
    compared = sorted({r["backend"] for r in rows if r["ok"] is not None})
    missing = sorted({r["backend"] for r in rows if r["ok"] is None})
    absent = f"; not available: {', '.join(missing)}" if missing else ""
    if not compared:
        return finding("parity", True, None, f"not applicable: no backend besides "
                       f"{ORACLE} is available ({', '.join(backends) or 'none'}){absent}",
                       rows, applicable=False)
    if not failed:
        worst = max(r["max abs err"] / r["tol"] for r in rows if r["ok"] is not None)
        summary = (f"{', '.join(compared)} matched the {ORACLE} oracle in {len(layers)} "
                   f"NSA layer(s), forward and gradients (worst error {worst:.2g} of its "
                   f"tolerance){absent}")
        return finding("parity", True, None, summary, rows)
    first = failed[0]
    summary = (f"backend {first['backend']} differs from the {ORACLE} oracle at "
               f"{first['module']} in {first['tensor']}: max abs err "
               f"{first['max abs err']:.3g} > tol {first['tol']:.3g} ({len(failed)} of "
               f"{sum(r['ok'] is not None for r in rows)} comparisons failed){absent}")
    return finding("parity", False, first["module"], summary, rows, backend=first["backend"])
