"""Block selection (NSA Eq.8-11): compressed probabilities -> block scores -> top-n indices.

For query t (0-based) and query head h:
  p_t[i]   softmax over visible compressed tokens (i*d + l - 1 <= t) of scale * q_t . K_cmp[i]
           (Eq.8); 0 for invisible tokens, all 0 when none is visible.
  s_t[j]   = sum_i p_t[i] * overlap([i*d, i*d+l), [j*l_sel, (j+1)*l_sel)) / d       (Eq.9)
           Overlap-length weighting is the paper's double sum written with spans: for
           l=32, d=16, l_sel=64 the compressed tokens starting in block j weigh 2, 2, 2, 1
           and the one starting in block j-1 whose span reaches into block j weighs 1,
           i.e. the paper's 1, 2, 2, 2, 1.
  S_t[j]   = sum of s_t[j] over the query heads of a GQA group                    (Eq.10)
  top-n    among available blocks (j*l_sel <= t): block 0, block t // l_sel and the one
           before it always; then the highest S_t, ties to the lower index         (Eq.11)
Output: int64 [B, S, Hkv, n_sel], valid indices ascending, then -1 padding.

Everything here runs under no_grad (selection is not differentiable), tile by tile over
queries so that only a [B, T, Hkv, n_blocks] score tile exists at a time.
"""

from __future__ import annotations

import math

import torch

from nsa.config import NSAConfig, num_select_blocks
from nsa.ops.workspace import Workspace


def span_block_weights(cfg: NSAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Overlap of a compressed span with the block it starts in and with the next block.

    Spans start every d tokens and d divides l_sel, so the pattern repeats every
    m = l_sel // d compressed tokens; l <= l_sel means a span touches at most two blocks.
    Returns (first [m], second [m]) overlap lengths for the r-th span of a block.
    """
    m = cfg.l_sel // cfg.d
    start_in_block = torch.arange(m) * cfg.d
    first = torch.clamp(cfg.l_sel - start_in_block, max=cfg.l)
    return first.float(), (cfg.l - first).float()


def group_block_scores(p_group: torch.Tensor, n_blocks: int, cfg: NSAConfig) -> torch.Tensor:
    """Eq.9 on head-summed probabilities. p_group [..., N] -> [..., n_blocks] (fp32)."""
    m = cfg.l_sel // cfg.d
    # n_blocks * m >= S / d >= N, so padding the spans to whole blocks never truncates
    p = torch.nn.functional.pad(p_group.float(), (0, n_blocks * m - p_group.shape[-1]))
    p = p.unflatten(-1, (n_blocks, m))
    first, second = span_block_weights(cfg)
    first, second = first.to(p.device) / cfg.d, second.to(p.device) / cfg.d
    own = p @ first  # spans starting in block j, their part inside j
    spill = p @ second  # spans starting in block j-1, their part inside j
    return own + torch.nn.functional.pad(spill[..., :-1], (1, 0))


def _rank_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered like (score, -block index): a larger key is a better block.

    The fp32 bits, made monotone for negative values too, fill the high 32 bits and the
    inverted block index the low ones, so one integer top-k resolves ties to the lower
    index exactly: no float tie-break, nothing that could differ between recomputes."""
    bits = (scores.float() + 0.0).contiguous().view(torch.int32)  # + 0.0 folds -0.0 into 0.0
    monotone = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    index = torch.arange(scores.shape[-1], device=scores.device)
    return monotone * (1 << 32) + ((1 << 31) - 1 - index)


def block_rank_keys(scores: torch.Tensor, query_pos: torch.Tensor,
                    cfg: NSAConfig) -> torch.Tensor:
    """Eq.11's order as one int64 key per block: scores [B, T, Hkv, n_blocks], query_pos
    [T] -> keys of the same shape. Unavailable blocks (j*l_sel > t) get the lowest key,
    forced ones (block 0 and the two local blocks) the highest keys, higher index first;
    the rest rank by score, ties to the lower index (`_rank_keys`)."""
    n_blocks = scores.shape[-1]
    j = torch.arange(n_blocks, device=scores.device)
    t = query_pos.view(1, -1, 1, 1)
    local = t // cfg.l_sel
    available = j * cfg.l_sel <= t
    forced = available & ((j == 0) | (j == local) | (j == local - 1))
    lowest, highest = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max
    key = torch.where(available, _rank_keys(scores), lowest)
    # forced blocks outrank every scored one; among themselves the higher index ranks first,
    # which never matters: there are at most three and n_sel >= 3 takes them all
    return torch.where(forced, highest - ((1 << 31) - 1 - j), key)


def top_n_from_keys(key: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """The n_sel blocks with the largest keys (from `block_rank_keys`) -> [..., n_sel]
    int64, ascending, padded with -1 where fewer blocks are available."""
    n_blocks = key.shape[-1]
    lowest = torch.iinfo(torch.int64).min
    top = key.topk(min(cfg.n_sel, n_blocks), dim=-1)
    chosen = torch.where(top.values > lowest, top.indices, n_blocks).sort(dim=-1).values
    chosen = torch.where(chosen == n_blocks, -1, chosen)
    if chosen.shape[-1] < cfg.n_sel:
        chosen = torch.nn.functional.pad(chosen, (0, cfg.n_sel - chosen.shape[-1]), value=-1)
    return chosen


def top_n_blocks(scores: torch.Tensor, query_pos: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """Eq.11. scores [B, T, Hkv, n_blocks], query_pos [T] -> [B, T, Hkv, n_sel] int64."""
    return top_n_from_keys(block_rank_keys(scores, query_pos, cfg), cfg)


@torch.no_grad()
def select_blocks(q: torch.Tensor, k_cmp: torch.Tensor, cfg: NSAConfig,
                  scale: float | None = None, query_chunk: int | None = None) -> torch.Tensor:
    """q [B, S, Hq, D], k_cmp [B, N, Hkv, D] -> block indices [B, S, Hkv, n_sel] (int64).

    Computes Eq.8-11 one query tile at a time; nothing of size S x N survives a tile.
    """
    seq = q.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    chunk = query_chunk or cfg.query_chunk
    keys_t = keys_transposed(k_cmp)
    ws = Workspace(q.device)
    out = torch.empty(q.shape[0], seq, k_cmp.shape[2], cfg.n_sel, dtype=torch.long,
                      device=q.device)
    # scores stay fp32 inside autocast regions: bf16 would change which blocks win
    with torch.autocast(q.device.type, enabled=False):
        for start in range(0, seq, chunk):
            stop = min(start + chunk, seq)
            tile = tile_probs(q, keys_t, start, stop, cfg, scale, ws)
            out[:, start:stop] = tile_block_indices(
                None if tile is None else tile[1], q, k_cmp.shape[2], start, stop, cfg)
    return out


def keys_transposed(k_cmp: torch.Tensor) -> torch.Tensor:
    """k_cmp [B, N, Hkv, D] -> fp32 [B, Hkv, D, N], the layout `tile_probs` reads."""
    return k_cmp.float().permute(0, 2, 3, 1)


def tile_probs(q: torch.Tensor, keys_t: torch.Tensor, start: int, stop: int, cfg: NSAConfig,
               scale: float, ws: Workspace) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Eq.8 for the queries start .. stop - 1: (logits, probs), both fp32
    [B, Hkv, T, G, N'] over the N' compressed tokens the tile's last query sees, in buffers
    "logits" and "probs" of `ws` (valid until the next tile); logits are scaled, -inf where
    hidden. None when no query of the tile sees a token."""
    batch, _, n_q_heads, head_dim = q.shape
    n_kv_heads, n_cmp = keys_t.shape[1], keys_t.shape[-1]
    group, n_tile = n_q_heads // n_kv_heads, stop - start
    # tokens i with i*d + l - 1 <= stop - 1: all that the tile's last query sees
    n_vis = min(n_cmp, max(0, (stop - cfg.l) // cfg.d + 1))
    if n_vis == 0:
        return None
    q_tile = q[:, start:stop].float().view(batch, n_tile, n_kv_heads, group,
                                           head_dim).transpose(1, 2)
    shape = (batch, n_kv_heads, n_tile, group, n_vis)
    logits = ws.take("logits", *shape)
    torch.matmul(q_tile.flatten(2, 3), keys_t[..., :n_vis], out=logits.view(
        batch, n_kv_heads, n_tile * group, n_vis)).mul_(scale)
    return logits, _compressed_probs(logits, start, cfg, ws.take("probs", *shape))


def tile_block_indices(probs: torch.Tensor | None, q: torch.Tensor, n_kv_heads: int,
                       start: int, stop: int, cfg: NSAConfig) -> torch.Tensor:
    """Eq.9-11 for the queries start .. stop - 1 from their `tile_probs` probabilities
    (None: no visible token) -> [B, T, Hkv, n_sel] int64."""
    n_blocks = num_select_blocks(q.shape[1], cfg)
    if probs is None:
        scores = torch.zeros(q.shape[0], stop - start, n_kv_heads, n_blocks, device=q.device)
    else:
        p_group = probs.sum(dim=3).transpose(1, 2)  # Eq.10 is linear: sum heads first
        scores = group_block_scores(p_group, n_blocks, cfg)
    return top_n_blocks(scores, torch.arange(start, stop, device=q.device), cfg)


def _compressed_probs(logits: torch.Tensor, start: int, cfg: NSAConfig,
                      out: torch.Tensor) -> torch.Tensor:
    """Eq.8 for one tile: logits [B, Hkv, T, G, N'] (scaled) of the queries
    start .. start + T - 1 -> probabilities into `out`, 0 on tokens a query cannot see (all
    0 when it sees none). Only the last columns can be invisible to some query of the tile
    (a tile spans T / d + 1 compressed tokens at most), so only they are masked."""
    n_tile, n_vis = logits.shape[2], logits.shape[-1]
    pos = torch.arange(start, start + n_tile, device=logits.device)
    first_hidden = min(n_vis, max(0, (start - cfg.l) // cfg.d + 1))
    last_key = torch.arange(first_hidden, n_vis, device=logits.device) * cfg.d + cfg.l - 1
    hidden = (last_key > pos.view(-1, 1)).view(1, 1, n_tile, 1, n_vis - first_hidden)
    logits[..., first_hidden:].masked_fill_(hidden, float("-inf"))
    # into a reused buffer: a fresh multi-MiB result per tile costs its page faults
    torch.ops.aten._softmax.out(logits, -1, False, out=out)
    return out.nan_to_num_(0.0)  # rows that see none -> 0
