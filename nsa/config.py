"""NSAConfig: the one typed configuration of the NSA attention layer and the model.

Everything that changes behaviour lives here; nothing in `nsa/` reads the environment.

Attention hyper-parameters follow the paper (arXiv 2502.11089):
    l      compression block length (raw keys summarised by one compressed token)
    d      compression stride (distance between consecutive compressed tokens)
    l_sel  selection block length
    n_sel  number of selected blocks per query (block 0 and the two local blocks included)
    w      sliding-window length (query t sees keys [t - w + 1, t])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

BACKENDS = ("naive", "torch", "triton", "auto")
BRANCHES = ("cmp", "sel", "win")
COMPRESSORS = ("mlp", "mean")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class NSAConfig:
    """Frozen configuration; call `validate()` (done by every constructor that takes one).

    Shapes used throughout: B batch, S sequence, Hq = n_heads query heads,
    Hkv = n_kv_heads key/value heads (GQA group size G = Hq // Hkv), D = head_dim.
    """

    dim: int = 512
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 64
    l: int = 32
    d: int = 16
    l_sel: int = 64
    n_sel: int = 16
    w: int = 512
    shared_kv: bool = False
    compressor: str = "mlp"
    compress_hidden: int = 0  # 0 -> l * head_dim // 2
    branches: tuple[str, ...] = BRANCHES
    backend: str = "auto"
    query_chunk: int = 256  # query tile of the memory-bounded torch backend
    rope_theta: float = 10000.0
    # model
    vocab_size: int = 256
    n_layers: int = 2
    ffn_mult: float = 8 / 3
    norm_eps: float = 1e-6
    grad_ckpt: bool = False
    dtype: str = "float32"
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.branches, (str, list, set, frozenset)):
            branches = [self.branches] if isinstance(self.branches, str) else self.branches
            ordered = sorted(branches, key=lambda b: BRANCHES.index(b) if b in BRANCHES else 99)
            object.__setattr__(self, "branches", tuple(ordered))

    def validate(self) -> NSAConfig:
        """Raise ValueError (one line, naming the field) on any impossible combination."""
        positive = ("dim", "n_heads", "n_kv_heads", "head_dim", "l", "d", "l_sel", "w",
                    "query_chunk", "vocab_size", "n_layers")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads: must be a multiple of n_kv_heads={self.n_kv_heads}, "
                             f"got {self.n_heads}")
        if self.l % self.d:
            raise ValueError(f"d: must divide l={self.l}, got {self.d}")
        if self.l > self.l_sel:
            raise ValueError(f"l: must be <= l_sel={self.l_sel}, got {self.l}")
        if self.l_sel % self.d:
            raise ValueError(f"d: must divide l_sel={self.l_sel}, got {self.d}")
        if not isinstance(self.n_sel, int) or self.n_sel < 3:
            raise ValueError(f"n_sel: must be an integer >= 3 (block 0 and two local blocks), "
                             f"got {self.n_sel!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.compressor not in COMPRESSORS:
            raise ValueError(f"compressor: must be one of {', '.join(COMPRESSORS)}, "
                             f"got {self.compressor!r}")
        if not isinstance(self.compress_hidden, int) or self.compress_hidden < 0:
            raise ValueError(f"compress_hidden: must be an integer >= 0 (0 = l*head_dim//2), "
                             f"got {self.compress_hidden!r}")
        if not self.branches or len(set(self.branches)) != len(self.branches) or any(
                b not in BRANCHES for b in self.branches):
            raise ValueError(f"branches: must be a non-empty subset of {', '.join(BRANCHES)} "
                             f"without repeats, got {self.branches!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not self.ffn_mult > 0:
            raise ValueError(f"ffn_mult: must be > 0, got {self.ffn_mult!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps: must be > 0, got {self.norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta: must be > 0, got {self.rope_theta!r}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: must be even (RoPE rotates pairs), got {self.head_dim}")
        return self

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def ffn_hidden(self) -> int:
        hidden = int(self.ffn_mult * self.dim)
        return (hidden + 63) // 64 * 64

    @property
    def phi_hidden(self) -> int:
        return self.compress_hidden or self.l * self.head_dim // 2

    def replace(self, **changes) -> NSAConfig:
        """A validated copy with `changes`; unknown names raise ValueError listing the fields."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ValueError(f"{unknown[0]}: not an NSAConfig field; fields are "
                             f"{', '.join(sorted(names))}")
        return dataclasses.replace(self, **changes).validate()


def num_compressed(seq_len: int, cfg: NSAConfig) -> int:
    """Number of compressed tokens of a sequence: token i covers raw keys [i*d, i*d + l)."""
    return 0 if seq_len < cfg.l else (seq_len - cfg.l) // cfg.d + 1


def num_select_blocks(seq_len: int, cfg: NSAConfig) -> int:
    """Number of selection blocks: block j covers raw keys [j*l_sel, (j+1)*l_sel)."""
    return (seq_len + cfg.l_sel - 1) // cfg.l_sel
