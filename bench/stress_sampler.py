"""Stress the progress sampler: bench/stress_program.py run ``--pairs`` times without and
with the sampler (alternated, each ``--seconds`` long), beside two CPU burners, and the
table of what came back: exit status (a signal is a crash), rounds done, peak and final
resident memory. Prints a Markdown table and a summary line; ``--json PATH`` writes the
rows.

    python bench/stress_sampler.py --pairs 4 --seconds 180 --json reports/stress_sampler.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "stress_program.py"
BURN = "while True: pass"


def run_once(seconds: float, sampler: bool, interval: float) -> dict:
    command = [sys.executable, str(PROGRAM), str(seconds), "--interval", str(interval)]
    if sampler:
        command.append("--sampler")
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    started, load = time.monotonic(), os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=seconds + 600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    row = json.loads(lines[-1]) if lines else {}
    row.update({"sampler": sampler, "rc": done.returncode,
                "crashed": done.returncode < 0,
                "signal": signal.Signals(-done.returncode).name if done.returncode < 0
                else None, "wall_s": round(time.monotonic() - started, 1),
                "load_start": load, "load_end": os.getloadavg()[0]})
    if done.returncode != 0:
        row["stderr_tail"] = done.stderr[-2000:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.burners)]
    rows = []
    try:
        for pair in range(args.pairs):
            for sampler in (False, True):
                row = run_once(args.seconds, sampler, args.interval)
                row["pair"] = pair
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    print("| pair | sampler | rc | rounds | peak MiB | final RSS MiB | wall s | load |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['pair']} | {'on' if row['sampler'] else 'off'} | {row['rc']} | "
              f"{row.get('rounds')} | {row.get('peak_mib', 0):.0f} | {row.get('rss_mib')} | "
              f"{row['wall_s']} | {row['load_start']:.1f}-{row['load_end']:.1f} |")
    watched = [row for row in rows if row["sampler"]]
    crashes = sum(row["crashed"] or row["rc"] != 0 for row in rows)
    delta = [on.get("peak_mib", 0) - off.get("peak_mib", 0)
             for off, on in zip(rows[::2], rows[1::2], strict=True)]
    print(f"runs with the sampler: {len(watched)} x {args.seconds / 60:.1f} min at "
          f"{args.interval * 1000:.0f} ms, beside {args.burners} burners; failed runs: "
          f"{crashes} of {len(rows)}; peak memory with minus without the sampler, per pair: "
          f"{', '.join(f'{d:+.0f}' for d in delta)} MiB (median "
          f"{statistics.median(delta):+.0f}); sampler failures counted: "
          f"{sum(row.get('sampler_failures') or 0 for row in watched)}")
    if args.json:
        args.json.write_text(json.dumps({"seconds": args.seconds, "interval_s": args.interval,
                                         "burners": args.burners, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
