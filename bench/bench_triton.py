"""Triton NSA on a CUDA GPU against dense causal SDPA (flash), bf16, forward+backward.

    python bench/bench_triton.py                              # S = 8k..64k, D = 128 and 64
    python bench/bench_triton.py --seqs 8192 16384 --head-dims 128

Two comparisons per (S, head_dim), 64 query heads / 4 KV heads, batch 1 (fewer heads with
--heads/--kv-heads when memory runs out):
  kernel  the selected-attention kernel (top-n blocks from real selection scores) against
          SDPA-flash causal attention on the same q and (GQA-expanded) k, v;
  layer   NSAAttention (backend triton: projections, compression, selection, three branches,
          gates) against a dense layer with the same projections and SDPA-flash.
Times are medians of CUDA-event-timed repeats after warm-up. "Useful" TFLOP/s counts only the
attention products a query is entitled to: 4*D per (query head, attended key) forward and
2.5 times that backward; for SDPA the causal half of S x S, for the selected kernel the
visible keys of the selected blocks, for the NSA layer the keys of all three branches.
Writes reports/bench_triton_gpu.md and .json with the GPU model and versions.
Without a CUDA device it prints one line and exits 2 (`--interpret-smoke` runs tiny shapes on
the CPU under TRITON_INTERPRET=1 to check the script itself; its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SEQS = (8192, 16384, 32768, 65536)
LAYER_MILESTONE = 4.0
"""Layer forward+backward speed-up over the dense layer aimed for at the longest S."""
HEAD_DIMS = (128, 64)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=SEQS)
    parser.add_argument("--head-dims", type=int, nargs="+", default=HEAD_DIMS)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=4096, help="model width of the layers")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench_triton_gpu")
    parser.add_argument("--profile", action="store_true",
                        help="print where the NSA layer's forward+backward spends GPU time "
                             "(torch.profiler, per NSA stage and per kernel) instead of timing")
    parser.add_argument("--no-parity", action="store_true",
                        help="skip the layer parity against the dense-mask oracle")
    parser.add_argument("--interpret-smoke", action="store_true",
                        help="tiny CPU shapes under the Triton interpreter (checks the script)")
    return parser.parse_args(argv)


class Timer:
    """Median wall time of fn() in ms: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, torch, device: str, repeats: int, warmup: int):
        self.torch, self.device, self.repeats, self.warmup = torch, device, repeats, warmup

    def __call__(self, fn) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.repeats):
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def attended_keys(seq: int, cfg, block_indices) -> dict[str, int]:
    """(query, kv-group) pairs x keys each branch attends, summed over queries (per kv head)."""
    import torch

    t = torch.arange(seq, device=block_indices.device)
    n_cmp = max(0, (seq - cfg.l) // cfg.d + 1)
    cmp = torch.clamp((t + 1 - cfg.l) // cfg.d + 1, min=0, max=n_cmp).sum().item()
    win = torch.clamp(t + 1, max=cfg.w).sum().item()
    blocks = block_indices[0]  # [S, Hkv, n]
    start = blocks.clamp(min=0) * cfg.l_sel
    visible = torch.clamp(t.view(-1, 1, 1) - start + 1, min=0, max=cfg.l_sel)
    visible = torch.minimum(visible, (seq - start).clamp(min=0))
    sel = torch.where(blocks >= 0, visible, 0).sum().item() / blocks.shape[1]
    return {"cmp": int(cmp), "sel": int(sel), "win": int(win)}


def flops(keys_per_head: float, n_heads: int, head_dim: int) -> float:
    """Useful forward + backward FLOPs: 4*D per (head, key) forward, 2.5x that backward."""
    return 3.5 * 4 * head_dim * n_heads * keys_per_head


def peer_selection():
    """fla's selected-attention autograd function and its version, or (None, why not)."""
    try:
        import importlib.metadata as metadata

        from fla.ops.nsa.parallel import ParallelNSAFunction
    except Exception as exc:  # noqa: BLE001 - any import failure means "not comparable here"
        return None, f"fla not importable ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    try:
        version = metadata.version("fla-core")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return ParallelNSAFunction, version


def rel_err(got, want) -> float:
    """max |got - want| / max |want| in fp32."""
    want = want.float()
    return ((got.float() - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()


def bench_kernels(torch, F, cfg, seq: int, timer: Timer, device: str, dtype) -> dict:
    """The selected-attention kernel (forward, forward+backward) against fla's NSA selection
    kernel on the same block indices, and against SDPA-flash on the same q and GQA-expanded
    k, v."""
    from nsa.ops.selection import select_blocks
    from nsa.ops.triton.ops import selected_attention

    heads, kv_heads, head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    scale = 1 / math.sqrt(head_dim)
    gen = torch.Generator(device=device).manual_seed(0)
    rand = lambda *s: torch.randn(*s, device=device, dtype=dtype, generator=gen)  # noqa: E731
    q = rand(1, seq, heads, head_dim).requires_grad_()
    k, v = (rand(1, seq, kv_heads, head_dim).requires_grad_() for _ in range(2))
    k_cmp = rand(1, max(0, (seq - cfg.l) // cfg.d + 1), kv_heads, head_dim)
    idx = select_blocks(q.detach(), k_cmp, cfg)
    grad_o = rand(1, seq, heads, head_dim)

    def ours(*args):
        return selected_attention(*args, idx, cfg.l_sel, scale)

    def forward_of(fn):
        def forward():
            with torch.no_grad():
                fn(q, k, v)
        return forward

    def step_of(fn):
        def step():
            torch.autograd.grad(fn(q, k, v), (q, k, v), grad_o)
        return step

    row = {"sel_fwd_ms": timer(forward_of(ours)), "sel_ms": timer(step_of(ours)),
           "keys": attended_keys(seq, cfg, idx)}
    peer, peer_version = peer_selection()
    row["fla"] = peer_version
    if peer is not None and heads // kv_heads >= 16:
        def fla(*args):
            return peer.apply(*args, idx, idx.shape[-1], cfg.l_sel, scale, None)

        row["fla_fwd_ms"] = timer(forward_of(fla))
        row["fla_ms"] = timer(step_of(fla))
        ours_out = [ours(q, k, v)]
        ours_out += torch.autograd.grad(ours_out[0], (q, k, v), grad_o)
        fla_out = [fla(q, k, v)]
        fla_out += torch.autograd.grad(fla_out[0], (q, k, v), grad_o)
        row["fla_agreement"] = max(rel_err(a, b) for a, b in zip(ours_out, fla_out,
                                                                  strict=True))

    q_h = q.detach().transpose(1, 2).requires_grad_()
    k_full, v_full = (x.detach().transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
                      .requires_grad_() for x in (k, v))
    grad_h = grad_o.transpose(1, 2)

    def dense_step():
        with flash_only(torch):
            o = F.scaled_dot_product_attention(q_h, k_full, v_full, is_causal=True)
        torch.autograd.grad(o, (q_h, k_full, v_full), grad_h)

    row["sdpa_kernel_ms"] = timer(dense_step)
    row["sel_tflops"] = flops(row["keys"]["sel"], heads, head_dim) / row["sel_ms"] / 1e9
    causal_keys = seq * (seq + 1) / 2
    row["sdpa_tflops"] = flops(causal_keys, heads, head_dim) / row["sdpa_kernel_ms"] / 1e9
    return row


def flash_only(torch):
    """SDPA restricted to the flash backend on CUDA (what "SDPA-flash" means here)."""
    import contextlib

    if not torch.cuda.is_available():
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def bench_layers(torch, cfg, seq: int, timer: Timer, device: str, dtype) -> dict:
    """NSAAttention (triton) vs the dense layer with the same projections, under autocast."""
    from bench_layer import DenseAttention

    from nsa.layer import NSAAttention

    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(1, seq, cfg.dim, device=device, generator=gen).requires_grad_()
    grad_x = torch.randn(1, seq, cfg.dim, device=device, generator=gen)

    def step_of(layer, flash=False):
        def step():
            import contextlib

            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32), \
                    (flash_only(torch) if flash else contextlib.nullcontext()):
                out = layer(x)
            out.backward(grad_x)
        return step

    def forward_of(layer, flash=False):
        def forward():
            import contextlib

            with torch.no_grad(), torch.autocast(device, dtype=dtype,
                                                 enabled=dtype != torch.float32), \
                    (flash_only(torch) if flash else contextlib.nullcontext()):
                layer(x)
        return forward

    nsa_layer = NSAAttention(cfg).to(device)
    row = {"nsa_layer_fwd_ms": timer(forward_of(nsa_layer)),
           "nsa_layer_ms": timer(step_of(nsa_layer)), "backend_used": nsa_layer.backend_used}
    del nsa_layer
    dense = DenseAttention(cfg).to(device)
    try:
        row["dense_layer_fwd_ms"] = timer(forward_of(dense, flash=True))
        row["dense_layer_ms"] = timer(step_of(dense, flash=True))
        row["dense_sdpa"] = "flash" if device == "cuda" else "default"
    except RuntimeError:  # flash refused this shape: the default SDPA choice, said so
        row["dense_layer_fwd_ms"] = timer(forward_of(dense, flash=False))
        row["dense_layer_ms"] = timer(step_of(dense, flash=False))
        row["dense_sdpa"] = "default"
    return row


def bench_config(torch, F, seq: int, head_dim: int, args, device: str, dtype) -> dict:
    from nsa.config import NSAConfig

    timer = Timer(torch, device, args.repeats, args.warmup)
    cfg = NSAConfig(dim=args.dim, n_heads=args.heads, n_kv_heads=args.kv_heads,
                    head_dim=head_dim, backend="triton")
    if args.interpret_smoke:
        cfg = cfg.replace(l=16, d=8, l_sel=16, n_sel=3, w=32)
    row = {"seq": seq, "head_dim": head_dim, "heads": args.heads, "kv_heads": args.kv_heads}
    row.update(bench_kernels(torch, F, cfg, seq, timer, device, dtype))
    row.update(bench_layers(torch, cfg, seq, timer, device, dtype))
    nsa_keys = sum(row["keys"].values())
    row["nsa_layer_tflops"] = flops(nsa_keys, args.heads, head_dim) / row["nsa_layer_ms"] / 1e9
    row["kernel_speedup"] = row["sdpa_kernel_ms"] / row["sel_ms"]
    row["layer_speedup"] = row["dense_layer_ms"] / row["nsa_layer_ms"]
    row["sel_fraction_of_dense_tflops"] = row["sel_tflops"] / row["sdpa_tflops"]
    if device == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    return row


def params_err(got: list, want: list) -> float:
    """The largest |got - want| over every parameter's gradient, over the largest |want| of
    all of them (a gradient that is 0 in exact arithmetic, such as a bias every compressed
    key shares, has no scale of its own)."""
    scale = max(w.float().abs().max().item() for w in want)
    return max((g.float() - w.float()).abs().max().item() for g, w in
               zip(got, want, strict=True)) / max(scale, 1e-30)


def parity(torch, args, device: str, seq: int = 2048) -> list[dict]:
    """Every backend's NSA layer against the dense-mask oracle (backend naive, fp32) on the
    same weights and input: max |got - want| / max |want| of the output and of dx, and
    `params_err` of the parameters' gradients. fp32 runs each backend in fp32; bf16 runs it
    under bf16 autocast."""
    from nsa.config import NSAConfig
    from nsa.layer import NSAAttention

    rows = []
    for head_dim in args.head_dims:
        cfg = NSAConfig(dim=args.dim, n_heads=args.heads, n_kv_heads=args.kv_heads,
                        head_dim=head_dim, backend="naive")
        if args.interpret_smoke:
            cfg = cfg.replace(l=16, d=8, l_sel=16, n_sel=3, w=32)
        gen = torch.Generator(device=device).manual_seed(2)
        oracle = NSAAttention(cfg).to(device)
        x = torch.randn(1, seq, cfg.dim, device=device, generator=gen)
        grad = torch.randn(1, seq, cfg.dim, device=device, generator=gen)

        def run(layer, dtype, x=x, grad=grad):
            leaf = x.clone().requires_grad_()
            with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                out = layer(leaf)
            out.float().backward(grad)
            return [out.detach().float(), leaf.grad] + [p.grad for p in layer.parameters()]

        want = run(oracle, torch.float32)
        for backend in ("torch", "triton"):
            for dtype in (torch.float32, torch.bfloat16):
                layer = NSAAttention(cfg.replace(backend=backend)).to(device)
                layer.load_state_dict(oracle.state_dict())
                got = run(layer, dtype)
                rows.append({"seq": seq, "head_dim": head_dim, "backend": backend,
                             "dtype": str(dtype).replace("torch.", ""),
                             "out": rel_err(got[0], want[0]), "dx": rel_err(got[1], want[1]),
                             "dparams": params_err(got[2:], want[2:])})
                del layer
    return rows


def environment(torch, device: str) -> dict:
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "device": device}
    env["fla"] = peer_selection()[1]
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    return env


def _ms(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if key in row else "-"


def render(rows: list[dict], env: dict, parity_rows: list[dict] | None = None) -> str:
    lines = [
        "# Triton NSA vs fla and SDPA-flash (bf16)", "",
        f"GPU: {env.get('gpu', env['device'])} · torch {env['torch']} · triton {env['triton']}"
        f" · CUDA {env.get('cuda', '-')} · fla-core {env.get('fla', '-')}", "",
        "## Selected attention on identical block indices (ms, median)", "",
        "| S | D | heads | ours fwd | fla fwd | ours fwd+bwd | fla fwd+bwd | vs fla (fwd+bwd) "
        "| ours vs fla max rel. diff | SDPA-flash fwd+bwd | selected TFLOP/s | SDPA TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs_fla = f"{r['fla_ms'] / r['sel_ms']:.2f}x" if "fla_ms" in r else "-"
        agree = f"{r['fla_agreement']:.1e}" if "fla_agreement" in r else "-"
        lines.append(
            f"| {r['seq']} | {r['head_dim']} | {r['heads']}/{r['kv_heads']} | "
            f"{_ms(r, 'sel_fwd_ms')} | {_ms(r, 'fla_fwd_ms')} | {_ms(r, 'sel_ms')} | "
            f"{_ms(r, 'fla_ms')} | {vs_fla} | {agree} | {_ms(r, 'sdpa_kernel_ms')} | "
            f"{r['sel_tflops']:.1f} | {r['sdpa_tflops']:.1f} |")
    lines += [
        "", "## NSA layer vs dense layer with the same projections (fwd+bwd, ms, median)", "",
        "| S | D | NSA fwd | dense fwd | fwd speed-up | NSA fwd+bwd | dense fwd+bwd "
        "| fwd+bwd speed-up | dense SDPA | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = f"{r['peak_gib']:.1f}" if "peak_gib" in r else "-"
        fwd = (f"{r['dense_layer_fwd_ms'] / r['nsa_layer_fwd_ms']:.2f}x"
               if "nsa_layer_fwd_ms" in r else "-")
        lines.append(f"| {r['seq']} | {r['head_dim']} | {_ms(r, 'nsa_layer_fwd_ms')} | "
                     f"{_ms(r, 'dense_layer_fwd_ms')} | {fwd} | {r['nsa_layer_ms']:.1f} | "
                     f"{r['dense_layer_ms']:.1f} | {r['layer_speedup']:.2f}x | "
                     f"{r.get('dense_sdpa', '-')} | {peak} |")
    if not parity_rows:
        lines += ["", "Parity against the dense-mask oracle was not measured in this run."]
    else:
        seq = parity_rows[0]["seq"]
        lines += ["", f"## Parity against the dense-mask oracle (fp32), S = {seq}",
                  "", "max |got - want| / max |want| of the layer's output and of dx; for the "
                  "parameters' gradients the largest error over the largest gradient; same "
                  "weights and input.", "",
                  "| D | backend | dtype | output | dx | parameter grads |",
                  "|---|---|---|---|---|---|"]
        for r in parity_rows:
            lines.append(f"| {r['head_dim']} | {r['backend']} | {r['dtype']} | {r['out']:.1e} "
                         f"| {r['dx']:.1e} | {r['dparams']:.1e} |")
    longest = [r for r in rows if r["seq"] == max(x["seq"] for x in rows)]
    lines += ["", "Targets: the selected kernel at least as fast as fla's (fwd+bwd, every row); "
              f"the NSA layer forward+backward >= {LAYER_MILESTONE:g}x the dense layer at the "
              "longest S (the paper reports 6x backward and 9x forward on an A100 against "
              "FlashAttention-2)."]
    for r in rows:
        if "fla_ms" in r:
            ratio = r["fla_ms"] / r["sel_ms"]
            lines.append(f"- S={r['seq']} D={r['head_dim']}: selected vs fla {ratio:.2f}x "
                         f"({'met' if ratio >= 1 else 'missed'})")
    for r in longest:
        met = r["layer_speedup"] >= LAYER_MILESTONE
        lines.append(f"- S={r['seq']} D={r['head_dim']}: layer {r['layer_speedup']:.2f}x "
                     f"({'met' if met else 'missed'})")
    return "\n".join(lines) + "\n"


STAGES = {"nsa.layer": ("select_blocks", "compressed_attention", "selected_attention",
                        "window_attention", "apply_rope", "rope_tables"),
          "nsa.ops.compress": ("Compressor.forward",)}


def profile_layer(torch, seq: int, head_dim: int, args, device: str, dtype) -> str:
    """The layer's forward+backward under torch.profiler with one range per NSA stage:
    the stages' GPU time and the kernels' self GPU time, largest first."""
    import importlib

    from torch.profiler import ProfilerActivity, profile, record_function

    from nsa.config import NSAConfig
    from nsa.layer import NSAAttention

    def ranged(name, fn):
        def wrapper(*a, **k):
            with record_function(f"nsa::{name}"):
                return fn(*a, **k)
        return wrapper

    originals = []
    for module_name, names in STAGES.items():
        module = importlib.import_module(module_name)
        for name in names:
            owner, attr = module, name
            if "." in name:
                owner, attr = getattr(module, name.split(".")[0]), name.split(".")[1]
            originals.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, ranged(name, getattr(owner, attr)))
    try:
        cfg = NSAConfig(dim=args.dim, n_heads=args.heads, n_kv_heads=args.kv_heads,
                        head_dim=head_dim, backend="triton")
        layer = NSAAttention(cfg).to(device)
        x = torch.randn(1, seq, cfg.dim, device=device, requires_grad=True)
        grad = torch.randn(1, seq, cfg.dim, device=device)

        def step():
            with torch.autocast(device, dtype=dtype):
                out = layer(x)
            out.backward(grad)

        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
    finally:
        for owner, attr, fn in originals:
            setattr(owner, attr, fn)
    from torch.autograd import DeviceType

    events = prof.key_averages()
    # GPU time of the kernels themselves: the ops and autograd nodes that launch them report
    # the same time again, and so do the nsa:: ranges around them
    kernels = [e for e in events
               if e.device_type == DeviceType.CUDA and not e.key.startswith("nsa::")]
    total = sum(e.self_device_time_total for e in kernels) / 1e3
    lines = [f"## profile S={seq} D={head_dim}: {total:.1f} ms of GPU time", "",
             "| NSA stage (forward) | GPU ms |", "|---|---|"]
    stages: dict[str, float] = {}  # a range is listed twice (host range, GPU annotation)
    for e in events:
        if e.key.startswith("nsa::"):
            stages[e.key[5:]] = max(stages.get(e.key[5:], 0.0), e.device_time_total / 1e3)
    for name, ms in sorted(stages.items(), key=lambda item: -item[1]):
        lines.append(f"| {name} | {ms:.2f} |")
    lines += ["", "| kernel | GPU ms | calls |", "|---|---|---|"]
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:25]:
        if e.self_device_time_total > 0:
            lines.append(f"| {e.key[:90]} | {e.self_device_time_total / 1e3:.2f} | {e.count} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.interpret_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are first imported
    import torch
    import torch.nn.functional as F

    if args.interpret_smoke:
        device, dtype = "cpu", torch.float32
        args.seqs, args.head_dims = [s for s in args.seqs if s <= 128] or [96], [16]
        args.heads, args.kv_heads, args.dim, args.repeats, args.warmup = 4, 2, 64, 1, 0
    elif not torch.cuda.is_available():
        print("bench_triton: needs a CUDA GPU (none found); run bench/bench_layer.py for the "
              "CPU torch backend", file=sys.stderr)
        return 2
    else:
        device, dtype = "cuda", torch.bfloat16
    if args.heads % args.kv_heads:
        print(f"bench_triton: --heads {args.heads} must be a multiple of --kv-heads "
              f"{args.kv_heads}", file=sys.stderr)
        return 2
    if args.profile:
        for head_dim in args.head_dims:
            for seq in args.seqs:
                print(profile_layer(torch, seq, head_dim, args, device, dtype), flush=True)
        return 0
    rows = []
    for head_dim in args.head_dims:
        for seq in args.seqs:
            try:
                rows.append(bench_config(torch, F, seq, head_dim, args, device, dtype))
            except torch.OutOfMemoryError:
                print(f"S={seq} D={head_dim}: out of memory; rerun with fewer --heads",
                      file=sys.stderr)
                torch.cuda.empty_cache()
            else:
                print(json.dumps(rows[-1]), flush=True)
    env = environment(torch, device)
    parity_rows = [] if args.no_parity else parity(torch, args, device,
                                                   seq=96 if args.interpret_smoke else 2048)
    text = render(rows, env, parity_rows)
    print(text)
    if not args.interpret_smoke:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"env": env, "rows": rows, "parity": parity_rows}, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
