"""Tile sizes and launch options of the Triton NSA kernels, timed on a CUDA GPU.

    python bench/tune_triton.py --seq 65536 --head-dim 128

Each variant changes one group of knobs from the current defaults (selected-attention
launch options, band-kernel tiles and launch options, score-kernel rows and warps) and
times the whole NSAAttention layer (backend triton, bf16 autocast) forward and
forward+backward: medians of CUDA-event-timed repeats after warm-up (the first call also
compiles). Prints one table; the defaults in nsa/ops/triton are chosen from it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def variants():
    """name -> {knob: value}; knobs: sel (launch options of the selected kernels), band
    (launch options of the band kernels), tiles (QUERY_TILE, KEY_TILE of the band kernels),
    score (TILE_ROWS, num_warps, num_stages of the score kernel)."""
    out = {"defaults": {}}
    for warps, stages in ((4, 1), (4, 3), (8, 2), (8, 3)):
        out[f"sel w{warps} s{stages}"] = {"sel": {"num_warps": warps, "num_stages": stages}}
    for warps, stages in ((8, 2), (4, 3)):
        out[f"band w{warps} s{stages}"] = {"band": {"num_warps": warps, "num_stages": stages}}
    for tiles in ((128, 64), (64, 128)):
        out[f"band tiles {tiles[0]}x{tiles[1]}"] = {"tiles": tiles}
    for rows, warps in ((128, 8), (32, 4)):
        out[f"score rows {rows} w{warps}"] = {"score": (rows, warps, 2)}
    return out


def apply(knobs: dict):
    """Set the knobs; returns a function that restores the defaults."""
    from nsa.ops.triton import band, scores, selected

    saved = (selected.launch_options, band.launch_options, band.QUERY_TILE, band.KEY_TILE,
             scores.TILE_ROWS, dict(scores.LAUNCH))
    if "sel" in knobs:
        selected.launch_options = lambda dtype, tile, o=knobs["sel"]: dict(o)
    if "band" in knobs:
        band.launch_options = lambda dtype, tile, o=knobs["band"]: dict(o)
    if "tiles" in knobs:
        band.QUERY_TILE, band.KEY_TILE = knobs["tiles"]
    if "score" in knobs:
        scores.TILE_ROWS = knobs["score"][0]
        scores.LAUNCH.update(num_warps=knobs["score"][1], num_stages=knobs["score"][2])

    def restore():
        (selected.launch_options, band.launch_options, band.QUERY_TILE, band.KEY_TILE,
         scores.TILE_ROWS, launch) = saved
        scores.LAUNCH.clear()
        scores.LAUNCH.update(launch)
    return restore


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=65536)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("tune_triton: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    from bench_triton import Timer

    from nsa.config import NSAConfig
    from nsa.layer import NSAAttention

    cfg = NSAConfig(dim=args.dim, n_heads=args.heads, n_kv_heads=args.kv_heads,
                    head_dim=args.head_dim, backend="triton")
    layer = NSAAttention(cfg).cuda()
    x = torch.randn(1, args.seq, cfg.dim, device="cuda", requires_grad=True)
    grad = torch.randn_like(x)
    timer = Timer(torch, "cuda", args.repeats, 2)

    def forward():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            layer(x)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x)
        out.backward(grad)

    print(f"S={args.seq} D={args.head_dim} heads {args.heads}/{args.kv_heads} "
          f"({torch.cuda.get_device_name()})")
    print("| variant | fwd ms | fwd+bwd ms |\n|---|---|---|", flush=True)
    for name, knobs in variants().items():
        if args.only and name not in args.only:
            continue
        restore = apply(knobs)
        try:
            fwd, full = timer(forward), timer(step)
            print(f"| {name} | {fwd:.2f} | {full:.2f} |", flush=True)
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is a row
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:80]} | |", flush=True)
        finally:
            restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())
