"""What the observer costs a loop of tiny module calls, and which of its threads causes it.

    python bench/bench_gil_handoffs.py                       # every variant, 5 rounds
    python bench/bench_gil_handoffs.py --variants plain run --rounds 5 --steps 400

bench/gil_loop.py (64 small residual blocks, about 260 module calls a step) runs once per
variant per round, the variants alternating within each round so that whatever else the
machine does falls on all alike. Each run reports its loop's wall seconds, the main
thread's CPU seconds and its voluntary context switches: in this loop (no I/O) a voluntary
switch is the main thread waiting for the GIL that another thread of its process took, and
on a loaded machine for a core after that. The switches and the CPU time move far less
with the machine's load than the wall time does, so they are the figures to compare on a
shared machine; the 1-minute load average is given before and after every run.

Variants: ``plain`` (no observer), ``run`` (the script under ``nsadiag run``, the observer
injected as a user gets it), ``run-baseline`` (the same under the nsadiag of another
source tree, ``--baseline-tree``: a checkout of an earlier commit, to compare before and
after a change in the same rounds), and in-process variants that start the observer inside the
script with some of its parts only (nsadiag.harness.watched.ObserverParts):
``observer`` (all parts), ``none`` (no part: the heartbeat file and exception hooks),
``sampler`` (the sampler alone: no torch hooks, no block events), ``no-block-events``
(all but the sampler's block events), ``no-compile-watch`` (all but the polling of
Dynamo's compiles), ``no-block-hooks`` (all but the forward pre-hooks on the model's
blocks). The torch hooks and the compile polling run on the sampler's
wake-ups, so there is no variant without the sampler but with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "bench" / "gil_loop.py"
IN_PROCESS = {
    "observer": "all",
    "none": "",
    "sampler": "sampler",
    "no-block-events": "sampler,torch_hooks,compile_watch,block_hooks",
    "no-compile-watch": "sampler,block_events,torch_hooks,block_hooks",
    "no-block-hooks": "sampler,block_events,torch_hooks,compile_watch",
}
VARIANTS = ("plain", "run", "run-baseline", *IN_PROCESS)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def one_run(variant: str, steps: int, scratch: Path, baseline: Path | None = None,
            compiled: bool = False) -> dict:
    """One run of the loop; its JSON line with the load before and after."""
    command = [sys.executable, str(LOOP), str(steps), *(["--compile"] if compiled else [])]
    run_dir = scratch / f"run-{time.monotonic_ns()}"
    cwd = ROOT
    if variant == "run-baseline":
        if baseline is None:
            raise SystemExit("bench_gil_handoffs: run-baseline needs --baseline-tree")
        cwd = baseline  # `python -m` imports nsadiag from the working directory first
    if variant in ("run", "run-baseline"):
        command = [sys.executable, "-m", "nsadiag.cli", "run", "--out", str(run_dir),
                   "--stall-timeout", "300", "--", *command]
    elif variant != "plain":
        command += ["--observe", IN_PROCESS[variant]]
    before = load_average()
    # a session of its own, as `nsadiag run` gives the command (the scheduler shares the
    # CPU between sessions): a plain run left in this one would get less
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=1800,
                          start_new_session=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_gil_handoffs: the {variant} run failed "
                         f"({done.returncode}): {done.stderr[-2000:]}")
    stdout = (run_dir / "stdout.txt").read_text() if variant.startswith("run") \
        else done.stdout
    found = json.loads(next(x for x in reversed(stdout.splitlines()) if x.startswith("{")))
    found.update(variant=variant, load_before=before, load_after=load_average())
    return found


def summary(rows: list[dict], variants: list[str]) -> dict[str, dict]:
    """Per variant: medians of wall, CPU and switches, and the median ratio to the plain
    run of the same round."""
    plain = {r["round"]: r for r in rows if r["variant"] == "plain"}
    found = {}
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        entry = {key: statistics.median(r[key] for r in mine)
                 for key in ("loop_s", "cpu_s", "voluntary", "involuntary")}
        # the sampler's own voluntary switches: one sleep a sample, and its waits for the GIL
        entry["sampler_voluntary"] = statistics.median(
            r["threads"].get("nsadiag-sampler", 0) for r in mine)
        paired = [r for r in mine if r["round"] in plain]
        if paired and variant != "plain":
            for key in ("loop_s", "cpu_s"):
                ratios = [r[key] / plain[r["round"]][key] for r in paired]
                entry[f"{key}_ratio"] = statistics.median(ratios)
                entry[f"{key}_ratio_range"] = [min(ratios), max(ratios)]
        entry["load_range"] = [min(min(r["load_before"], r["load_after"]) for r in mine),
                               max(max(r["load_before"], r["load_after"]) for r in mine)]
        entry["runs"] = len(mine)
        found[variant] = entry
    return found


def markdown(result: dict) -> str:
    lines = [f"`python bench/bench_gil_handoffs.py --rounds {result['rounds']} --steps "
             f"{result['steps']}{' --compile' if result.get('compile') else ''} --variants "
             f"{' '.join(result['variants'])}` on "
             f"{result['cpus']} CPUs: medians over the rounds; the ratios are each run's "
             "over the plain run of its round.", "",
             "| variant | runs | loop wall s | wall / plain (range) | main thread CPU s | "
             "CPU / plain (range) | main thread voluntary switches | involuntary | sampler "
             "thread voluntary | 1-min load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for variant, s in result["summary"].items():
        def ratio(key: str, s: dict = s) -> str:
            if f"{key}_ratio" not in s:
                return "-"
            low, high = s[f"{key}_ratio_range"]
            return f"{s[f'{key}_ratio']:.3f} ({low:.2f}-{high:.2f})"

        lines.append(f"| {variant} | {s['runs']} | {s['loop_s']:.2f} | {ratio('loop_s')} | "
                     f"{s['cpu_s']:.2f} | {ratio('cpu_s')} | {s['voluntary']:.0f} | "
                     f"{s['involuntary']:.0f} | {s['sampler_voluntary']:.0f} | "
                     f"{s['load_range'][0]:.1f}-"
                     f"{s['load_range'][1]:.1f} |")
    lines += ["", "Every run, in order:", "",
              "| round | variant | loop wall s | main thread CPU s | voluntary | involuntary "
              "| sampler voluntary | load before -> after |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['round']} | {r['variant']} | {r['loop_s']:.2f} | {r['cpu_s']:.2f} "
                     f"| {r['voluntary']} | {r['involuntary']} | "
                     f"{r['threads'].get('nsadiag-sampler', '-')} | {r['load_before']:.2f} -> "
                     f"{r['load_after']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--compile", action="store_true",
                        help="train torch.compile(model), compiled before the timed loop")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="a source tree whose nsadiag the run-baseline variant uses")
    parser.add_argument("--out", type=Path, default=None,
                        help="write OUT.json and OUT.md (default: print only)")
    args = parser.parse_args()
    if "plain" not in args.variants:
        args.variants.insert(0, "plain")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-gil-") as tmp:
        for round_ in range(args.rounds):
            for variant in args.variants:
                row = one_run(variant, args.steps, Path(tmp), args.baseline_tree, args.compile)
                row["round"] = round_
                rows.append(row)
                print(f"round {round_} {variant:24} wall {row['loop_s']:6.2f} s  cpu "
                      f"{row['cpu_s']:5.2f} s  voluntary {row['voluntary']:4}  load "
                      f"{row['load_before']:.1f} -> {row['load_after']:.1f}  other threads' "
                      f"voluntary {row['threads']}", flush=True)
    result = {"rows": rows, "summary": summary(rows, args.variants), "rounds": args.rounds,
              "steps": args.steps, "compile": args.compile, "variants": args.variants,
              "cpus": len(os.sched_getaffinity(0))}
    text = markdown(result)
    if args.out is not None:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
