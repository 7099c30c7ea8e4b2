"""Tile sizes and launch options of the Triton NSA kernels, timed on a CUDA GPU.

    python bench/tune_triton.py --seq 65536 --head-dim 128

Each variant changes one group of knobs from the current defaults (selected-attention
launch options, band-kernel tiles and launch options, the compressed + selection kernel's
rows, warps and stages, the compressed dK/dV work-item length) and
times the whole NSAAttention layer (backend triton, bf16 autocast) forward and
forward+backward: medians of CUDA-event-timed repeats after warm-up (the first call also
compiles). Prints one table; the defaults in nsa/ops/triton are chosen from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def variants():
    """name -> {knob: value}; knobs: sel (launch options of the selected kernels), band
    (launch options of the band kernels), tiles (QUERY_TILE, KEY_TILE of the band kernels),
    select (TILE_ROWS, num_warps, num_stages of the compressed + selection kernel), items
    (ITEM_QUERIES of the compressed dK/dV work items)."""
    out = {"defaults": {}}
    for warps, stages in ((4, 3), (8, 2)):
        out[f"sel w{warps} s{stages}"] = {"sel": {"num_warps": warps, "num_stages": stages}}
    for warps, stages in ((8, 2), (4, 3)):
        out[f"band w{warps} s{stages}"] = {"band": {"num_warps": warps, "num_stages": stages}}
    out["band tiles 128x64"] = {"tiles": (128, 64)}
    for rows, warps, stages in ((128, 8, 2), (128, 4, 2), (64, 4, 3), (32, 4, 2)):
        out[f"select rows {rows} w{warps} s{stages}"] = {"select": (rows, warps, stages)}
    for items in (2048, 8192):
        out[f"dkdv items {items}"] = {"items": items}
    return out


def apply(knobs: dict):
    """Set the knobs; returns a function that restores the defaults."""
    from nsa.ops.triton import band, select, selected

    saved = (selected.launch_options, band.launch_options, band.QUERY_TILE, band.KEY_TILE,
             band.ITEM_QUERIES, select.TILE_ROWS, dict(select.LAUNCH))
    if "sel" in knobs:
        selected.launch_options = lambda dtype, tile, o=knobs["sel"]: dict(o)
    if "band" in knobs:
        band.launch_options = lambda dtype, tile, o=knobs["band"]: dict(o)
    if "tiles" in knobs:
        band.QUERY_TILE, band.KEY_TILE = knobs["tiles"]
    if "items" in knobs:
        band.ITEM_QUERIES = knobs["items"]
    if "select" in knobs:
        select.TILE_ROWS = knobs["select"][0]
        select.LAUNCH.update(num_warps=knobs["select"][1], num_stages=knobs["select"][2])

    def restore():
        (selected.launch_options, band.launch_options, band.QUERY_TILE, band.KEY_TILE,
         band.ITEM_QUERIES, select.TILE_ROWS, launch) = saved
        select.LAUNCH.clear()
        select.LAUNCH.update(launch)
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
    parser.add_argument("--json", type=Path, help="also write the timings here")
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
    results = {}
    for name, knobs in variants().items():
        if args.only and name not in args.only:
            continue
        restore = apply(knobs)
        try:
            fwd, full = timer(forward), timer(step)
            print(f"| {name} | {fwd:.2f} | {full:.2f} |", flush=True)
            results[name] = {"knobs": knobs, "fwd_ms": fwd, "ms": full}
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is a row
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:80]} | |", flush=True)
        finally:
            restore()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
