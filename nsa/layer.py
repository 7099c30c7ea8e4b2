"""NSAAttention: one Native Sparse Attention layer (arXiv 2502.11089 §3).

x [B, S, dim] -> [B, S, dim]:
  q = RoPE(W_q x)                         [B, S, Hq, D]
  per branch c in cfg.branches: k_c = RoPE(W_k^c x), v_c = W_v^c x  [B, S, Hkv, D]
      (independent K/V per branch, paper §3.3.3; one shared set with cfg.shared_kv)
  cmp: attention over phi-compressed k_cmp, v_cmp (complete blocks only)
  sel: attention over the n_sel blocks chosen from the compressed scores of k_cmp
  win: attention over the last w keys
  o_t = sum_c sigmoid(W_g^c x_t) * o_c    (one gate per head per branch)
  out = W_o o
Only the branches in cfg.branches are built and computed. When "sel" runs without "cmp",
the compressed keys (never the compressed values) are still computed: selection scores
them.

Backends: "naive" (the dense oracle), "torch" (memory-bounded tiles, every device),
"triton" (the kernels of nsa.ops.triton: CUDA, or CPU under Triton's interpreter; a shape or
device they cannot take raises ValueError naming the limit), "auto" (triton on CUDA when the
shape is supported, else torch — the reason logged once). `backend_used` records which
implementation ran last. Block selection (Eq.8-11) ranks blocks by the same keys on every
backend; on torch the compressed branch's forward pass ranks them from its own
probabilities, on triton one kernel computes the compressed branch and the selection.
"""

from __future__ import annotations

import functools
import logging
import math

import torch
from torch import nn

from nsa.config import NSAConfig
from nsa.ops import selection
from nsa.ops import torch as torch_ops
from nsa.ops.compress import Compressor
from nsa.ops.mix import gated_sum
from nsa.ops.naive import naive_nsa_attention
from nsa.ops.rope import apply_rope, rope_tables
from nsa.ops.triton import unsupported_reason

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _triton_import_error() -> str | None:
    """Why the kernel module cannot be imported (once per process), or None."""
    try:
        from nsa.ops.triton import ops  # noqa: F401  (importing builds the kernels)
    except Exception as error:  # triton missing, or broken on this platform
        return f"backend triton: cannot import triton ({type(error).__name__}: {error})"
    return None


def _triton_ops():
    """The kernel module, imported on first use so that nothing compiles on other paths."""
    error = _triton_import_error()
    if error:
        raise ValueError(error)
    from nsa.ops.triton import ops
    return ops


def triton_unavailable(cfg: NSAConfig, device: torch.device) -> str | None:
    """Why the triton backend cannot run `cfg` on `device`, or None when it can."""
    reason = unsupported_reason(cfg.head_dim, cfg.l_sel if "sel" in cfg.branches else None)
    return reason or _triton_import_error() or _triton_ops().device_unsupported_reason(device)


def resolve_backend(cfg: NSAConfig, device: torch.device) -> tuple[str, str | None]:
    """(implementation to run, why auto did not pick triton or None).

    naive/torch run as named; triton runs or raises ValueError; auto is triton on CUDA when
    the shape is supported and torch everywhere else. There is no fallback behind the name."""
    if cfg.backend in ("naive", "torch"):
        return cfg.backend, None
    if device.type != "cuda" and cfg.backend == "auto":
        return "torch", None
    reason = triton_unavailable(cfg, device)
    if cfg.backend == "triton":
        if reason:
            raise ValueError(reason)
        return "triton", None
    return ("torch", reason) if reason else ("triton", None)


def compressed_attention(q, k_cmp, v_cmp, cfg: NSAConfig, scale: float, backend: str,
                         select: bool = False):
    """(o, lse, block indices or None) of the compressed branch on `backend` ("torch" or
    "triton"). With `select` the selected branch's blocks are ranked in the same call
    (Eq.8's probabilities are this branch's weights: one softmax serves both; on triton one
    kernel computes both); otherwise the indices are None and `select_blocks` computes them."""
    if backend == "triton":  # the kernels take one dtype; phi may have promoted k/v_cmp
        if select:
            return _triton_ops().compressed_attention_and_selection(q, k_cmp, v_cmp, cfg,
                                                                    scale)
        o, lse = _triton_ops().compressed_attention(q, k_cmp.to(q.dtype), v_cmp.to(q.dtype),
                                                    cfg.l, cfg.d, scale)
        return o, lse, None
    if select:
        return torch_ops.compressed_attention_and_selection(q, k_cmp, v_cmp, cfg, scale,
                                                            cfg.query_chunk)
    o, lse = torch_ops.compressed_attention(q, k_cmp, v_cmp, cfg.l, cfg.d, scale,
                                            cfg.query_chunk)
    return o, lse, None


def select_blocks(q, k_cmp, cfg: NSAConfig, scale: float, backend: str, lse_cmp=None,
                  ranked=None):
    """Block indices [B, S, Hkv, n_sel] of the selected branch (Eq.8-11) on `backend`: the
    ones the compressed pass `ranked` already, the Triton selection kernel (scores and top-n
    in one kernel) or the tiled torch code; all follow `nsa.ops.selection`'s ranking."""
    if ranked is not None:
        return ranked
    if backend == "triton":
        return _triton_ops().select_blocks(q, k_cmp, lse_cmp, cfg, scale)
    return selection.select_blocks(q, k_cmp, cfg, scale, cfg.query_chunk)


def selected_attention(q, k, v, block_indices, cfg: NSAConfig, scale: float, backend: str):
    """o of the selected branch on `backend` ("torch" or "triton")."""
    if backend == "triton":
        return _triton_ops().selected_attention(q, k.to(q.dtype), v.to(q.dtype), block_indices,
                                                cfg.l_sel, scale)
    return torch_ops.selected_attention(q, k, v, block_indices, cfg.l_sel, scale,
                                        cfg.query_chunk)


def window_attention(q, k, v, cfg: NSAConfig, scale: float, backend: str):
    """o of the sliding-window branch on `backend` ("torch" or "triton")."""
    if backend == "triton":
        return _triton_ops().window_attention_with_lse(q, k.to(q.dtype), v.to(q.dtype), cfg.w,
                                                       scale)[0]
    return torch_ops.window_attention(q, k, v, cfg.w, scale, cfg.query_chunk)


class NSAAttention(nn.Module):
    def __init__(self, cfg: NSAConfig):
        super().__init__()
        self.cfg = cfg.validate()
        self.branches = cfg.branches
        self.backend = cfg.backend
        self.backend_used: str | None = None
        if cfg.backend == "triton":  # shape limits are known now; the device only at forward
            reason = unsupported_reason(cfg.head_dim, cfg.l_sel if "sel" in cfg.branches else None)
            if reason:
                raise ValueError(reason)
        width = cfg.n_kv_heads * cfg.head_dim
        self.kv_pieces = self._kv_pieces()
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.kv_proj = nn.Linear(cfg.dim, len(self.kv_pieces) * width, bias=False)
        self.gate_proj = nn.Linear(cfg.dim, cfg.n_heads * len(self.branches))
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        uses_compression = "cmp" in self.branches or "sel" in self.branches
        self.compress_k = Compressor(cfg) if uses_compression else None
        self.compress_v = Compressor(cfg) if "cmp" in self.branches else None

    def _kv_pieces(self) -> list[tuple[str, str]]:
        """(branch, "k" | "v") for each slice of kv_proj's output, in order."""
        if self.cfg.shared_kv:
            return [("shared", "k"), ("shared", "v")]
        pieces = [(b, part) for b in self.branches for part in ("k", "v")]
        if "sel" in self.branches and "cmp" not in self.branches:
            pieces.append(("cmp", "k"))  # keys scored for selection
        return pieces

    def project(self, x: torch.Tensor):
        """x [B, S, dim] -> q [B,S,Hq,D], kv {branch: (k, v)}, gates {branch: [B,S,Hq]}.

        q, k/v and gate projections run as one matmul (one pass over x, and backward forms
        dx once instead of summing three)."""
        cfg = self.cfg
        batch, seq, _ = x.shape
        cos, sin = rope_tables(seq, cfg.head_dim, cfg.rope_theta, x.device, x.dtype)
        kv_width = cfg.n_kv_heads * cfg.head_dim
        widths = [self.q_proj.out_features, *[kv_width] * len(self.kv_pieces),
                  self.gate_proj.out_features]
        weight = torch.cat([self.q_proj.weight, self.kv_proj.weight, self.gate_proj.weight])
        bias = torch.cat([self.gate_proj.bias.new_zeros(sum(widths[:-1])),
                          self.gate_proj.bias])
        # one split into every piece: backward assembles the projection's gradient once
        q, *pieces, gate_logits = nn.functional.linear(x, weight, bias).split(widths, dim=-1)
        q = q.view(batch, seq, cfg.n_heads, cfg.head_dim)
        q = apply_rope(q, cos.to(q.dtype), sin.to(q.dtype))
        pieces = [p.view(batch, seq, cfg.n_kv_heads, cfg.head_dim) for p in pieces]
        named = {}
        for (branch, part), tensor in zip(self.kv_pieces, pieces, strict=True):
            if part == "k":
                tensor = apply_rope(tensor, cos.to(tensor.dtype), sin.to(tensor.dtype))
            named[branch, part] = tensor
        needed = set(self.branches) | ({"cmp"} if "sel" in self.branches else set())
        source = (lambda b: "shared") if cfg.shared_kv else (lambda b: b)
        kv = {b: (named[source(b), "k"], named.get((source(b), "v"))) for b in needed}
        gate_all = torch.sigmoid(gate_logits).view(batch, seq, cfg.n_heads, len(self.branches))
        gates = {b: gate_all[..., i] for i, b in enumerate(self.branches)}
        return q, kv, gates

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        backend, why_not_triton = resolve_backend(self.cfg, x.device)
        q, kv, gates = self.project(x)
        if backend == "naive":
            o, _ = naive_nsa_attention(q, kv, gates, self.compress_k, self.compress_v, self.cfg)
            o = o.to(q.dtype)
        else:
            o = self._tiled_attention(q, kv, gates, backend)
        if self.backend_used != backend:
            reason = f" ({why_not_triton})" if why_not_triton else ""
            log.info("NSAAttention: backend %s%s", backend, reason)
            self.backend_used = backend
        return self.o_proj(o.flatten(2))

    def _tiled_attention(self, q, kv, gates, backend: str) -> torch.Tensor:
        k_cmp = self.compress_k(kv["cmp"][0]) if "cmp" in kv else None
        v_cmp = self.compress_v(kv["cmp"][1]) if "cmp" in self.branches else None
        # the ops compute in fp32 tile by tile; autocast would turn their matmuls to bf16
        with torch.autocast(q.device.type, enabled=False):
            return self._mix_branches(q, kv, gates, k_cmp, v_cmp, backend)

    def _mix_branches(self, q, kv, gates, k_cmp, v_cmp, backend: str) -> torch.Tensor:
        cfg = self.cfg
        scale = 1.0 / math.sqrt(cfg.head_dim)
        outputs, branch_gates = [], []
        lse_cmp = ranked = None
        if "cmp" in self.branches:
            o_cmp, lse_cmp, ranked = compressed_attention(q, k_cmp, v_cmp, cfg, scale, backend,
                                                          select="sel" in self.branches)
            outputs.append(o_cmp)
            branch_gates.append(gates["cmp"])
        if "sel" in self.branches:
            block_indices = select_blocks(q, k_cmp, cfg, scale, backend, lse_cmp, ranked)
            k_sel, v_sel = kv["sel"]
            outputs.append(selected_attention(q, k_sel, v_sel, block_indices, cfg, scale,
                                              backend))
            branch_gates.append(gates["sel"])
        if "win" in self.branches:
            k_win, v_win = kv["win"]
            outputs.append(window_attention(q, k_win, v_win, cfg, scale, backend))
            branch_gates.append(gates["win"])
        if backend == "triton":  # one pass each way instead of per-row matrix products
            return _triton_ops().gated_sum(outputs, torch.stack(branch_gates, -1))
        return gated_sum(outputs, branch_gates)
