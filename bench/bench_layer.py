"""NSA layer vs dense causal SDPA: forward+backward time and peak memory, one process each.

    python bench/bench_layer.py                      # S = 1k..32k, CPU fp32, writes reports/
    python bench/bench_layer.py --seqs 1024 4096 --repeats 2
    python bench/bench_layer.py --model-step         # also a 12-layer training step at 2k
    python bench/bench_layer.py --profile 16384 32768  # where NSA's time goes, per stage

Every configuration runs in a fresh child process (`--one KIND S`), so the peak resident set
size it reports belongs to that configuration alone. Peak memory is ru_maxrss of the child
minus its resident size just before the first forward (weights and inputs included in the
baseline); on CUDA it is torch.cuda.max_memory_allocated. Each row records the machine's
1-minute load average before and after it: on a shared machine the times are only as good
as that load (a load above the core count means other processes took CPU time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nsa.config import NSAConfig  # noqa: E402
from nsa.layer import NSAAttention  # noqa: E402
from nsa.ops import torch as torch_ops  # noqa: E402
from nsa.ops.selection import select_blocks  # noqa: E402

PAPER = NSAConfig(dim=512, n_heads=8, n_kv_heads=2, head_dim=64, backend="torch")


class DenseAttention(nn.Module):
    """Causal full attention with the same projections as NSAAttention (GQA, RoPE-free)."""

    def __init__(self, cfg: NSAConfig):
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.kv_proj = nn.Linear(cfg.dim, 2 * cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        cfg = self.cfg
        q = self.q_proj(x).view(batch, seq, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k, v = self.kv_proj(x).view(batch, seq, 2, cfg.n_kv_heads, cfg.head_dim).unbind(2)
        o = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).flatten(2))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run_one(kind: str, seq: int, repeats: int, device: str) -> dict:
    """Time forward+backward of one layer; returns a result row."""
    load_before = os.getloadavg()[0]
    torch.manual_seed(0)
    layer = (NSAAttention(PAPER) if kind == "nsa" else DenseAttention(PAPER)).to(device)
    x = torch.randn(1, seq, PAPER.dim, device=device, requires_grad=True)
    grad = torch.randn(1, seq, PAPER.dim, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    baseline = rss_bytes()
    fwd_times, bwd_times = [], []
    for _ in range(repeats + 1):  # the first round warms up
        sync()
        start = time.perf_counter()
        out = layer(x)
        sync()
        mid = time.perf_counter()
        out.backward(grad)
        sync()
        fwd_times.append(mid - start)
        bwd_times.append(time.perf_counter() - mid)
        x.grad = None
        del out
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # the fastest timed round: on a shared machine, the one other processes disturbed least
    fwd_s, bwd_s = min(zip(fwd_times[1:], bwd_times[1:], strict=True), key=sum)
    row = {"kind": kind, "seq": seq, "fwd_s": fwd_s, "bwd_s": bwd_s,
           "rounds": [[f, b] for f, b in zip(fwd_times[1:], bwd_times[1:], strict=True)],
           "peak_mem_bytes": peak_rss - baseline,
           "peak_rss_bytes": peak_rss, "load_before": load_before,
           "load_after": os.getloadavg()[0]}
    if device == "cuda":
        row["peak_mem_bytes"] = torch.cuda.max_memory_allocated()
    row["total_s"] = row["fwd_s"] + row["bwd_s"]
    return row


def _stage_inputs(seq: int, device: str):
    """The layer's own projections at S = seq as plain tensors, and the layer."""
    torch.manual_seed(0)
    layer = NSAAttention(PAPER).to(device)
    with torch.no_grad():
        q, kv, _ = layer.project(torch.randn(1, seq, PAPER.dim, device=device))
        k_cmp = layer.compress_k(kv["cmp"][0])
        v_cmp = layer.compress_v(kv["cmp"][1])
    return layer, q, kv, k_cmp, v_cmp


def _time_stage(fn, inputs, repeats: int, sync) -> tuple[float, float]:
    """(forward s, backward s) of the fastest of `repeats` rounds of fn(*leaves) after one
    warm-up round; leaves are fresh copies of `inputs` that require grad, the upstream
    gradient is random."""
    fwd, bwd = [], []
    for _ in range(repeats + 1):
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        sync()
        start = time.perf_counter()
        out = fn(*leaves)
        sync()
        mid = time.perf_counter()
        out.backward(torch.randn_like(out))
        sync()
        fwd.append(mid - start)
        bwd.append(time.perf_counter() - mid)
    return min(zip(fwd[1:], bwd[1:], strict=True), key=sum)


def run_profile(seq: int, repeats: int, device: str) -> dict:
    """Forward and backward seconds of each NSA stage, each timed alone on the layer's own
    projections (so the stages add up to the layer minus projections, RoPE and gates), and
    of the whole layer; the fastest rounds after one warm-up round. The compressed branch
    runs as the layer runs it, ranking the selected blocks in its forward pass."""
    load_before = os.getloadavg()[0]
    layer, q, kv, k_cmp, v_cmp = _stage_inputs(seq, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    cfg, scale = PAPER, PAPER.head_dim ** -0.5
    block_indices = select_blocks(q, k_cmp, cfg, scale, cfg.query_chunk)
    stages = {
        "phi (k and v)": (lambda k, v: layer.compress_k(k).sum() + layer.compress_v(v).sum(),
                          [kv["cmp"][0], kv["cmp"][1]]),
        "compressed + selection": (lambda q, k, v: torch_ops.compressed_attention_and_selection(
            q, k, v, cfg, scale, cfg.query_chunk)[0], [q, k_cmp, v_cmp]),
        "selected": (lambda q, k, v: torch_ops.selected_attention(
            q, k, v, block_indices, cfg.l_sel, scale, cfg.query_chunk), [q, *kv["sel"]]),
        "window": (lambda q, k, v: torch_ops.window_attention(
            q, k, v, cfg.w, scale, cfg.query_chunk), [q, *kv["win"]]),
    }
    row = {"kind": "profile", "seq": seq, "stages": {}}
    for name, (fn, inputs) in stages.items():
        row["stages"][name] = _time_stage(fn, inputs, repeats, sync)
    x = torch.randn(1, seq, PAPER.dim, device=device)
    row["layer"] = _time_stage(layer, [x], repeats, sync)
    row["load_before"], row["load_after"] = load_before, os.getloadavg()[0]
    return row


def profile_lines(rows: list[dict]) -> list[str]:
    """A markdown table of the stage times of `run_profile` rows."""
    names = list(rows[0]["stages"])
    out = ["| stage | " + " | ".join(f"S={r['seq']} fwd s | bwd s" for r in rows) + " |",
           "|---|" + "---|---|" * len(rows)]
    for name in [*names, "rest of the layer", "layer"]:
        cells = []
        for r in rows:
            if name == "layer":
                fwd, bwd = r["layer"]
            elif name == "rest of the layer":
                fwd = r["layer"][0] - sum(f for f, _ in r["stages"].values())
                bwd = r["layer"][1] - sum(b for _, b in r["stages"].values())
            else:
                fwd, bwd = r["stages"][name]
            cells += [f"{fwd:.2f}", f"{bwd:.2f}" if bwd else "-"]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    loads = ", ".join(f"S={r['seq']}: {r['load_before']:.1f} -> {r['load_after']:.1f}"
                      for r in rows)
    out += ["", f"1-minute load average before -> after: {loads}."]
    return out


def ceiling_lines(profile: list[dict], by: dict) -> list[str]:
    """What the speed-up could reach if NSA's attention ran at SDPA's own FLOP rate (its
    time = SDPA's / FLOP bound) with phi and the rest of the layer as measured; block
    ranking (inside "compressed + selection") counted as free, so this is an upper bound."""
    cells = []
    for r in profile:
        dense = by.get(("dense", r["seq"]), {}).get("total_s")
        if not dense:
            continue
        phi = sum(r["stages"].get("phi (k and v)", (0.0, 0.0)))
        rest = sum(r["layer"]) - sum(f + b for f, b in r["stages"].values())
        bound = attention_flops("dense", r["seq"]) / attention_flops("nsa", r["seq"])
        cells.append(f"{dense / (dense / bound + phi + rest):.2f}x at S={r['seq']}")
    if not cells:
        return []
    return ["Ceiling: with every attention stage at SDPA's own FLOP rate, phi and the rest of "
            "the layer as measured and block ranking free, the speed-up would be "
            + ", ".join(cells) + "."]


def run_model_step(seq: int, device: str) -> dict:
    """One optimizer step of a 12-layer, hidden-768, 12-head model with checkpointing."""
    from nsa.model import NSATransformer

    torch.manual_seed(0)
    cfg = NSAConfig(dim=768, n_heads=12, n_kv_heads=4, head_dim=64, n_layers=12,
                    vocab_size=256, grad_ckpt=True, backend="torch")
    model = NSATransformer(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 256, (1, seq + 1), device=device)
    baseline = rss_bytes()
    times = []
    for _ in range(2):
        start = time.perf_counter()
        loss = model.loss(ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"kind": "model-step", "seq": seq, "first_step_s": times[0], "step_s": times[1],
            "peak_rss_bytes": peak, "peak_mem_bytes": peak - baseline,
            "params": sum(p.numel() for p in model.parameters())}


def child(args: list[str], timeout: float) -> dict:
    cmd = [sys.executable, __file__, *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def attention_flops(kind: str, seq: int) -> float:
    """Useful forward attention FLOPs (QK^T and PV, 2 FLOPs per MAC), causal."""
    cfg = PAPER
    per_key = 4 * cfg.head_dim * cfg.n_heads
    if kind == "dense":
        return per_key * seq * (seq + 1) / 2
    keys = sum(min(t + 1, cfg.w) + min(t + 1, cfg.n_sel * cfg.l_sel)
               + max(0, (t - cfg.l) // cfg.d + 1) for t in range(seq))
    return per_key * keys


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def load_cell(*runs: dict) -> str:
    loads = [r[key] for r in runs for key in ("load_before", "load_after") if key in r]
    return f"{max(loads):.1f}" if loads else "-"


def target_lines(by: dict) -> list[str]:
    """The project's CPU targets, each with the measured value and met / missed."""
    def speedup(seq):
        dense, nsa = by.get(("dense", seq), {}), by.get(("nsa", seq), {})
        return dense.get("total_s", math.nan) / nsa.get("total_s", math.nan)

    nsa_rows = sorted((r for r in by.values() if r.get("kind") == "nsa" and "peak_mem_bytes" in r),
                      key=lambda r: r["seq"])
    growth = max((b["peak_mem_bytes"] / a["peak_mem_bytes"]
                  for a, b in zip(nsa_rows, nsa_rows[1:], strict=False)
                  if b["seq"] == 2 * a["seq"]), default=math.nan)
    at4k = by.get(("nsa", 4096), {})
    checks = [
        ("speed-up >= 2x at 16k", speedup(16384), speedup(16384) >= 2, "x"),
        ("speed-up >= 4x at 32k", speedup(32768), speedup(32768) >= 4, "x"),
        ("fwd+bwd < 2 s at 4k", at4k.get("total_s", math.nan),
         at4k.get("total_s", math.inf) < 2, " s"),
        ("peak < 2 GiB at 4k", at4k.get("peak_mem_bytes", math.nan) / 2**30,
         at4k.get("peak_mem_bytes", math.inf) < 2 * 2**30, " GiB"),
        ("peak growth <= 2.2x per doubling", growth, growth <= 2.2, "x"),
    ]
    out = ["| target | measured | |", "|---|---|---|"]
    for name, value, ok, unit in checks:
        if math.isnan(value):
            out.append(f"| {name} | - | not measured |")
        else:
            out.append(f"| {name} | {value:.2f}{unit} | {'met' if ok else 'missed'} |")
    return out


def write_report(rows: list[dict], step: dict | None, path: Path, device: str,
                 profile: list[dict]) -> str:
    lines = [
        "# NSA layer vs dense SDPA: forward + backward",
        "",
        f"Device: {device} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads), torch {torch.__version__}, fp32, batch 1.",
        f"Layer: hidden {PAPER.dim}, {PAPER.n_heads} query heads, {PAPER.n_kv_heads} KV heads, "
        f"head dim {PAPER.head_dim}; NSA l={PAPER.l}, d={PAPER.d}, l_sel={PAPER.l_sel}, "
        f"n_sel={PAPER.n_sel}, w={PAPER.w}, backend torch. The fastest of the timed rounds "
        "after one warm-up round (on a shared machine, the round other processes disturbed "
        "least; every round is in the JSON), each configuration in a fresh process. Peak "
        "memory: peak RSS minus RSS before the first forward.",
        "",
        "| S | SDPA fwd+bwd s | NSA fwd s | NSA bwd s | NSA fwd+bwd s | speed-up | "
        "SDPA peak | NSA peak | NSA peak growth | FLOP bound | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r.get("kind"), r.get("seq")): r for r in rows}
    prev_peak = None
    for seq in sorted({r["seq"] for r in rows if "seq" in r}):
        dense, nsa = by.get(("dense", seq), {}), by.get(("nsa", seq), {})
        cells = [str(seq)]
        cells.append(f"{dense['total_s']:.2f}" if "total_s" in dense else dense.get("error", "-"))
        if "total_s" in nsa:
            cells += [f"{nsa['fwd_s']:.2f}", f"{nsa['bwd_s']:.2f}", f"{nsa['total_s']:.2f}"]
        else:
            cells += ["-", "-", nsa.get("error", "-")]
        speedup = dense.get("total_s", math.nan) / nsa.get("total_s", math.nan)
        cells.append(f"{speedup:.2f}x" if speedup == speedup else "-")
        cells.append(fmt_bytes(dense["peak_mem_bytes"]) if "peak_mem_bytes" in dense else "-")
        cells.append(fmt_bytes(nsa["peak_mem_bytes"]) if "peak_mem_bytes" in nsa else "-")
        peak = nsa.get("peak_mem_bytes")
        cells.append(f"{peak / prev_peak:.2f}x" if peak and prev_peak else "-")
        prev_peak = peak
        bound = attention_flops("dense", seq) / attention_flops("nsa", seq)
        cells.append(f"{bound:.1f}x")
        cells.append(load_cell(dense, nsa))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "FLOP bound: dense causal attention FLOPs / NSA attention FLOPs (the "
              "speed-up if both ran at the same FLOP rate; projections excluded). Load: the "
              f"highest 1-minute load average seen around the two runs of that row, on "
              f"{os.cpu_count()} CPUs; above that count other processes were taking CPU time "
              "and the row's times are inflated.", ""]
    lines += target_lines(by)
    if profile:
        lines += ["", "## Where NSA's time goes", "",
                  "Each stage timed alone on the layer's own projections (fastest round after "
                  "a warm-up round, fresh process per size); the rest of the layer is the "
                  "projections, RoPE, gates and the branch sum.", ""]
        lines += profile_lines(profile)
        lines += ["", *ceiling_lines(profile, by)]
    if step:
        lines += ["", "## One training step, 12 layers, hidden 768, 12 heads (4 KV), S=2048, "
                  "gradient checkpointing, AdamW", ""]
        if "error" in step:
            lines.append(f"Failed: {step['error']}")
        else:
            lines.append(f"{step['params'] / 1e6:.1f} M parameters; step {step['step_s']:.1f} s "
                         f"(first step {step['first_step_s']:.1f} s); peak RSS "
                         f"{fmt_bytes(step['peak_rss_bytes'])} "
                         f"({fmt_bytes(step['peak_mem_bytes'])} above the loaded model).")
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--model-step", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "bench_layer_cpu.md")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="re-render the report from a JSON file written by a full run")
    parser.add_argument("--profile-seqs", type=int, nargs="*", default=[16384, 32768],
                        help="sizes (among --seqs) whose per-stage NSA profile the report shows")
    parser.add_argument("--only-profile", action="store_true",
                        help="print the per-stage profile of --profile-seqs and nothing else")
    parser.add_argument("--one", nargs=2, metavar=("KIND", "SEQ"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, seq = args.one[0], int(args.one[1])
        if kind == "model-step":
            row = run_model_step(seq, args.device)
        elif kind == "profile":
            row = run_profile(seq, args.repeats, args.device)
        else:
            row = run_one(kind, seq, args.repeats, args.device)
        print(json.dumps(row))
        return
    if args.render:
        saved = json.loads(args.render.read_text())
        print(write_report(saved["rows"], saved["model_step"], args.out, args.device,
                           saved.get("profile", [])))
        return
    profile_seqs = args.profile_seqs if args.only_profile else \
        [s for s in args.profile_seqs if s in args.seqs]
    profile = [child(["--one", "profile", str(seq), "--repeats", str(args.repeats),
                      "--device", args.device], args.timeout) for seq in profile_seqs]
    profile = [r for r in profile if "error" not in r]
    if args.only_profile:
        print("\n".join(profile_lines(profile)) if profile else "profile failed")
        return
    rows = []
    for seq in args.seqs:
        for kind in ("dense", "nsa"):
            row = {"kind": kind, "seq": seq, **child(
                ["--one", kind, str(seq), "--repeats", str(args.repeats),
                 "--device", args.device], args.timeout)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    step = None
    if args.model_step:
        step = child(["--one", "model-step", "2048", "--device", args.device], args.timeout)
        print(json.dumps(step), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(write_report(rows, step, args.out, args.device, profile))
    args.out.with_suffix(".json").write_text(json.dumps(
        {"rows": rows, "model_step": step, "profile": profile}, indent=1))

if __name__ == "__main__":
    main()
