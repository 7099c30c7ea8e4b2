"""Dense-mask oracle of NSA attention: O(S^2) memory and time, fp32, written to be read.

Used by tests only. Every mask is built explicitly from the definitions in docs/nsa.md, with
no shared code from the fast paths except the per-window phi MLP (`Compressor.summarize`).

Layouts: q [B, S, Hq, D]; k, v [B, S, Hkv, D]; head h of q reads kv head h // G.
"""

from __future__ import annotations

import math

import torch

from nsa.config import NSAConfig, num_compressed, num_select_blocks


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention under an explicit boolean mask, in fp32.

    q [B, S, Hq, D]; k, v [B, N, Hkv, D]; mask [B, S, Hkv, N] (True = query may attend key),
    shared by the G query heads of a kv group. Returns (o [B, S, Hq, D], lse [B, S, Hq]).
    A query with no allowed key gets o = 0 and lse = -inf (never NaN). Autocast is
    switched off: the oracle stays fp32 inside a bf16 region.
    """
    with torch.autocast(q.device.type, enabled=False):
        return _masked_attention_fp32(q, k, v, mask, scale)


def _masked_attention_fp32(q, k, v, mask, scale):
    batch, seq, n_q_heads, head_dim = q.shape
    n_kv_heads = k.shape[2]
    group = n_q_heads // n_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    qf, kf, vf = q.float(), k.float(), v.float()
    k_rep = kf.repeat_interleave(group, dim=2)  # [B, N, Hq, D]
    v_rep = vf.repeat_interleave(group, dim=2)
    mask_rep = mask.repeat_interleave(group, dim=2)  # [B, S, Hq, N]
    logits = torch.einsum("bshd,bnhd->bshn", qf, k_rep) * scale
    logits = logits.masked_fill(~mask_rep, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # -inf where the row is empty
    probs = torch.exp(logits - lse.unsqueeze(-1).clamp_min(torch.finfo(torch.float32).min))
    probs = torch.where(mask_rep, probs, torch.zeros_like(probs))
    out = torch.einsum("bshn,bnhd->bshd", probs, v_rep)
    return out, lse


def compressed_visibility(seq_len: int, cfg: NSAConfig, device=None) -> torch.Tensor:
    """[S, N] bool: compressed token i (raw keys [i*d, i*d+l)) is visible to query t
    iff it is complete, i*d + l - 1 <= t."""
    n_cmp = num_compressed(seq_len, cfg)
    t = torch.arange(seq_len, device=device).unsqueeze(1)
    last_key = torch.arange(n_cmp, device=device).unsqueeze(0) * cfg.d + cfg.l - 1
    return last_key <= t


def overlap_matrix(seq_len: int, cfg: NSAConfig, device=None) -> torch.Tensor:
    """[N, n_blocks] fp32: number of raw positions shared by compressed span i and block j,
    counted position by position."""
    n_cmp = num_compressed(seq_len, cfg)
    n_blocks = num_select_blocks(seq_len, cfg)
    pos = torch.arange(max(seq_len, n_cmp * cfg.d + cfg.l), device=device)
    in_span = (pos.unsqueeze(0) >= torch.arange(n_cmp, device=device).unsqueeze(1) * cfg.d) & (
        pos.unsqueeze(0) < torch.arange(n_cmp, device=device).unsqueeze(1) * cfg.d + cfg.l)
    in_block = (pos.unsqueeze(1) // cfg.l_sel) == torch.arange(n_blocks, device=device)
    return in_span.float() @ in_block.float()


def naive_block_scores(p_cmp: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """Eq.9 + Eq.10. p_cmp [B, S, Hq, N] compressed probabilities -> [B, S, Hkv, n_blocks]:
    score_j = sum_i p_i * overlap(span_i, block_j) / d, summed over the heads of a group."""
    batch, seq, n_q_heads, _ = p_cmp.shape
    per_head = p_cmp.float() @ overlap_matrix(seq, cfg, p_cmp.device) / cfg.d
    return per_head.view(batch, seq, cfg.n_kv_heads, n_q_heads // cfg.n_kv_heads, -1).sum(3)


def naive_select(scores: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """Eq.11 by explicit ranking. scores [B, S, Hkv, n_blocks] -> block indices
    [B, S, Hkv, n_sel] ascending, padded with -1.

    Available blocks for query t: j * l_sel <= t. Block 0, block t // l_sel and the one
    before it are forced. A block's rank counts the available blocks that beat it
    (forced first, then higher score, then lower index); ranks < n_sel are selected.
    """
    batch, seq, n_kv_heads, n_blocks = scores.shape
    t = torch.arange(seq, device=scores.device).view(1, seq, 1, 1)
    j = torch.arange(n_blocks, device=scores.device).view(1, 1, 1, n_blocks)
    available = (j * cfg.l_sel <= t).expand(batch, seq, n_kv_heads, n_blocks)
    local = t // cfg.l_sel
    forced = available & ((j == 0) | (j == local) | (j == local - 1))
    # beats[..., a, b]: block a ranks ahead of block b
    fa, fb = forced.unsqueeze(-1), forced.unsqueeze(-2)
    sa, sb = scores.unsqueeze(-1), scores.unsqueeze(-2)
    ia, ib = j.unsqueeze(-1), j.unsqueeze(-2)
    beats = (fa & ~fb) | ((fa == fb) & ((sa > sb) | ((sa == sb) & (ia < ib))))
    beats = beats & available.unsqueeze(-1)
    rank = beats.sum(dim=-2)  # how many available blocks beat block b
    chosen = available & (rank < cfg.n_sel)
    index = torch.where(chosen, j.expand_as(chosen),
                        torch.full_like(chosen, n_blocks, dtype=torch.long))
    index = index.sort(dim=-1).values[..., : cfg.n_sel]
    if index.shape[-1] < cfg.n_sel:
        pad = torch.full((*index.shape[:-1], cfg.n_sel - index.shape[-1]), n_blocks,
                         dtype=torch.long, device=index.device)
        index = torch.cat([index, pad], dim=-1)
    return torch.where(index == n_blocks, torch.full_like(index, -1), index)


def selection_mask(block_indices: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """[B, S, Hkv, n] indices (-1 padded) -> [B, S, Hkv, S] bool: key s is in a selected
    block of query t and s <= t. The mask is a set of keys, so a block listed twice in a row
    is attended once (the rule of every backend, `nsa.ops.indices`)."""
    s = torch.arange(seq_len, device=block_indices.device)
    key_block = (s // block_size).view(1, 1, 1, 1, seq_len)
    in_selected = (block_indices.unsqueeze(-1) == key_block).any(dim=-2)
    causal = s.unsqueeze(0) <= s.unsqueeze(1)  # [t, s]
    return in_selected & causal.view(1, seq_len, 1, seq_len)


def window_mask(seq_len: int, window: int, device=None) -> torch.Tensor:
    """[S, S] bool: key s visible to query t iff t - window < s <= t."""
    t = torch.arange(seq_len, device=device).unsqueeze(1)
    s = torch.arange(seq_len, device=device).unsqueeze(0)
    return (s <= t) & (s > t - window)


def naive_compress(x: torch.Tensor, compressor, cfg: NSAConfig) -> torch.Tensor:
    """[B, S, H, D] -> [B, N, H, D] by applying phi to each explicit window in turn."""
    n_cmp = num_compressed(x.shape[1], cfg)
    if n_cmp == 0:
        return x.new_zeros(x.shape[0], 0, *x.shape[2:])
    windows = [x[:, i * cfg.d: i * cfg.d + cfg.l].transpose(1, 2) for i in range(n_cmp)]
    return torch.stack([compressor.summarize(w) for w in windows], dim=1)


def naive_compressed_probs(q: torch.Tensor, k_cmp: torch.Tensor, cfg: NSAConfig,
                           scale: float) -> torch.Tensor:
    """Eq.8: [B, S, Hq, N] softmax over visible compressed tokens; 0 elsewhere."""
    group = q.shape[2] // k_cmp.shape[2]
    with torch.autocast(q.device.type, enabled=False):
        logits = torch.einsum("bshd,bnhd->bshn", q.float(),
                              k_cmp.float().repeat_interleave(group, dim=2)) * scale
    visible = compressed_visibility(q.shape[1], cfg, q.device).view(1, q.shape[1], 1, -1)
    logits = logits.masked_fill(~visible, float("-inf"))
    return torch.softmax(logits, dim=-1).nan_to_num(0.0)


def naive_nsa_attention(q: torch.Tensor, kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
                        gates: dict[str, torch.Tensor], compress_k, compress_v,
                        cfg: NSAConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole NSA attention of one layer, densely.

    q [B, S, Hq, D] (RoPE applied); kv[branch] = (k, v) each [B, S, Hkv, D] for the
    branches in cfg.branches; kv["cmp"] is also present when only "sel" runs, because its
    compressed keys are the ones scored for selection (its v is then unused, may be None);
    gates[branch] [B, S, Hq] in (0, 1); compress_k / compress_v: Compressor modules.
    Returns (o [B, S, Hq, D] = sum_c g_c * o_c, block indices [B, S, Hkv, n_sel] or None
    when "sel" is not among the branches).
    """
    seq = q.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    batch, n_kv_heads = q.shape[0], cfg.n_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    block_indices = None
    if "cmp" in cfg.branches or "sel" in cfg.branches:
        k_cmp = naive_compress(kv["cmp"][0], compress_k, cfg)
    if "cmp" in cfg.branches:
        v_cmp = naive_compress(kv["cmp"][1], compress_v, cfg)
        mask = compressed_visibility(seq, cfg, q.device).view(1, seq, 1, -1)
        o_cmp, _ = masked_attention(q, k_cmp, v_cmp,
                                    mask.expand(batch, seq, n_kv_heads, -1), scale)
        out = out + gates["cmp"].unsqueeze(-1) * o_cmp
    if "sel" in cfg.branches:
        with torch.no_grad():
            p_cmp = naive_compressed_probs(q.detach(), k_cmp.detach(), cfg, scale)
            block_indices = naive_select(naive_block_scores(p_cmp, cfg), cfg)
        k_sel, v_sel = kv["sel"]
        o_sel, _ = masked_attention(q, k_sel, v_sel,
                                    selection_mask(block_indices, seq, cfg.l_sel), scale)
        out = out + gates["sel"].unsqueeze(-1) * o_sel
    if "win" in cfg.branches:
        k_win, v_win = kv["win"]
        mask = window_mask(seq, cfg.w, q.device).view(1, seq, 1, seq)
        o_win, _ = masked_attention(q, k_win, v_win,
                                    mask.expand(batch, seq, n_kv_heads, seq), scale)
        out = out + gates["win"].unsqueeze(-1) * o_win
    return out, block_indices
