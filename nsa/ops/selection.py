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
queries (`CompressedTiles`, which the torch compressed branch shares) so that only a
[B, T, Hkv, n_blocks] score tile exists at a time; a tile ranks only the blocks its last
query may select. Probabilities are exp(logit - shift) / sum with shift 0 when
`nsa.ops.shift` bounds every logit of the call, the row maximum otherwise.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from nsa.config import NSAConfig, num_select_blocks
from nsa.ops import shift
from nsa.ops.workspace import Workspace


def span_block_weights(cfg: NSAConfig) -> tuple[list[int], list[int]]:
    """Overlap of a compressed span with the block it starts in and with the next block.

    Spans start every d tokens and d divides l_sel, so the pattern repeats every
    m = l_sel // d compressed tokens; l <= l_sel means a span touches at most two blocks.
    Returns (first [m], second [m]) overlap lengths for the r-th span of a block.
    """
    first = [min(cfg.l_sel - r * cfg.d, cfg.l) for r in range(cfg.l_sel // cfg.d)]
    return first, [cfg.l - f for f in first]


def group_block_scores(p_group: torch.Tensor, n_blocks: int, cfg: NSAConfig) -> torch.Tensor:
    """Eq.9 on head-summed probabilities. p_group [..., N] -> [..., n_blocks] (fp32), the
    blocks j < n_blocks (n_blocks * l_sel / d >= N: every token starts in one of them).

    Block j collects the m = l_sel / d spans starting in it (weights first / d) and those
    starting in block j - 1 (second / d): one multiply-add over a strided view per nonzero
    weight, with a block of zeros in front for j = 0."""
    m = cfg.l_sel // cfg.d
    p = torch.nn.functional.pad(p_group.float(), (m, n_blocks * m - p_group.shape[-1]))
    p = p.unflatten(-1, (n_blocks + 1, m))
    first, second = span_block_weights(cfg)
    terms = [(p[..., 1:, r], w / cfg.d) for r, w in enumerate(first) if w] + \
        [(p[..., :-1, r], w / cfg.d) for r, w in enumerate(second) if w]
    scores = torch.mul(terms[0][0], terms[0][1])
    for span, weight in terms[1:]:
        scores.add_(span, alpha=weight)
    return scores


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
    out = torch.empty(q.shape[0], seq, k_cmp.shape[2], cfg.n_sel, dtype=torch.long,
                      device=q.device)
    # scores stay fp32 inside autocast regions: bf16 would change which blocks win
    with torch.autocast(q.device.type, enabled=False):
        tiles = CompressedTiles(q, k_cmp, cfg, scale, Workspace(q.device))
        for start in range(0, seq, chunk):
            stop = min(start + chunk, seq)
            out[:, start:stop] = tiles.block_indices(tiles.weights(start, stop), start, stop)
    return out


class TileWeights(NamedTuple):
    """Eq.8 for one query tile [start, stop), rows r = (query, head of the group) of each
    (batch, kv head), over the N' compressed tokens the tile's last query sees:
    weights [B*Hkv, T*G, N'] = exp(scale * q.k - shift), exactly 0 on tokens the row's query
    cannot see; row_sum [B*Hkv, T*G] their sum (0 when the query sees none); shift
    [B*Hkv, T*G] or None for 0. Probabilities are weights / row_sum, and
    lse = shift + log(row_sum)."""

    weights: torch.Tensor
    row_sum: torch.Tensor
    shift: torch.Tensor | None

    def lse(self) -> torch.Tensor:
        """[B*Hkv, T*G] log-sum-exp in units of scale * q.k; -inf for rows that see none."""
        lse = self.row_sum.log()
        return lse if self.shift is None else lse.add_(self.shift)


class CompressedTiles:
    """Eq.8-11 for one call, one query tile at a time (shared by `select_blocks` and the
    compressed branch's forward, so both rank blocks with the same arithmetic).

    The logits are exponentiated as they are when `nsa.ops.shift` finds the call's logits
    small enough (one matmul and one exp pass), and shifted by their row maximum otherwise.
    Buffers come from `ws` and are valid until the next tile."""

    def __init__(self, q: torch.Tensor, k_cmp: torch.Tensor, cfg: NSAConfig, scale: float,
                 ws: Workspace):
        self.batch, self.seq, n_q_heads, self.head_dim = q.shape
        self.n_kv_heads, self.n_cmp = k_cmp.shape[2], k_cmp.shape[1]
        self.group = n_q_heads // self.n_kv_heads
        self.q, self.cfg, self.scale, self.ws = q, cfg, scale, ws
        # [B*Hkv, N, D]: one contiguous key matrix per (batch, kv head)
        self.keys = k_cmp.float().transpose(1, 2).reshape(self.batch * self.n_kv_heads,
                                                          self.n_cmp, self.head_dim)
        self.unshifted = shift.unshifted_exp_is_safe(q, k_cmp, scale)

    def n_visible(self, stop: int) -> int:
        """Compressed tokens the query stop - 1 sees: i*d + l - 1 <= stop - 1."""
        return min(self.n_cmp, max(0, (stop - self.cfg.l) // self.cfg.d + 1))

    def query_rows(self, start: int, stop: int) -> torch.Tensor:
        """fp32 [B*Hkv, T*G, D] copy of the tile's queries times the softmax scale."""
        n_tile = stop - start
        part = self.q[:, start:stop].unflatten(2, (self.n_kv_heads, self.group))
        rows = self.ws.take("q", self.batch, self.n_kv_heads, n_tile, self.group,
                            self.head_dim)
        rows.copy_(part.permute(0, 2, 1, 3, 4)).mul_(self.scale)
        return rows.view(-1, n_tile * self.group, self.head_dim)

    def weights(self, start: int, stop: int) -> TileWeights | None:
        """The tile's `TileWeights`, or None when no query of the tile sees a token."""
        n_vis = self.n_visible(stop)
        if n_vis == 0:
            return None
        cfg, n_tile = self.cfg, stop - start
        q_rows = self.query_rows(start, stop)
        out = self.ws.take("weights", q_rows.shape[0], q_rows.shape[1], n_vis)
        torch.bmm(q_rows, self.keys[:, :n_vis].transpose(1, 2), out=out)
        # only the newest tokens can be hidden from some query of the tile
        first_hidden = min(n_vis, max(0, (start - cfg.l) // cfg.d + 1))
        pos = torch.arange(start, stop, device=out.device)
        last_key = torch.arange(first_hidden, n_vis, device=out.device) * cfg.d + cfg.l - 1
        hidden = (last_key > pos.view(-1, 1)).view(1, n_tile, 1, n_vis - first_hidden)
        newest = out.view(-1, n_tile, self.group, n_vis)[..., first_hidden:]
        row_shift = None
        if self.unshifted:
            out.exp_()
        else:
            newest.masked_fill_(hidden, -math.inf)
            # rows that see no token have max -inf: shift by the lowest float instead
            row_shift = out.amax(-1).clamp_min_(torch.finfo(torch.float32).min)
            out.sub_(row_shift.unsqueeze(-1)).clamp_min_(shift.EXP_FLOOR).exp_()
        newest.masked_fill_(hidden, 0.0)
        return TileWeights(out, out.sum(-1), row_shift)

    def group_probs(self, tile: TileWeights) -> torch.Tensor:
        """Eq.8's probabilities summed over the heads of each group (Eq.10 is linear, so
        the heads are summed first): [B, Hkv, T, N']."""
        n_rows, n_vis = tile.weights.shape[1:]
        inverse = torch.where(tile.row_sum > 0, tile.row_sum.reciprocal(), 0.0)
        rows = self.batch * self.n_kv_heads * (n_rows // self.group)
        summed = torch.bmm(inverse.view(rows, 1, self.group),
                           tile.weights.view(rows, self.group, n_vis))
        return summed.view(self.batch, self.n_kv_heads, -1, n_vis)

    def block_indices(self, tile: TileWeights | None, start: int, stop: int) -> torch.Tensor:
        """Eq.9-11 for the queries start .. stop - 1 -> [B, T, Hkv, n_sel] int64. Only the
        blocks some query of the tile may select (j * l_sel <= stop - 1) are ranked."""
        cfg = self.cfg
        n_blocks = min(num_select_blocks(self.seq, cfg), (stop - 1) // cfg.l_sel + 1)
        if tile is None:
            scores = torch.zeros(self.batch, self.n_kv_heads, stop - start, n_blocks,
                                 device=self.q.device)
        else:
            scores = group_block_scores(self.group_probs(tile), n_blocks, cfg)
        positions = torch.arange(start, stop, device=self.q.device)
        return top_n_blocks(scores.transpose(1, 2), positions, cfg)
