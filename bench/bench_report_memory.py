"""Peak memory of `nsadiag report` against the size of trials.jsonl.

    python bench/bench_report_memory.py                  # 0, 0.25, 1 and 4 GiB; prints a table
    python bench/bench_report_memory.py --gib 1 --repo ../other-checkout

Each run directory holds two valid trial records with one line of N GiB between them (NUL
bytes in a sparse file: no disk is used, and the line is read as a real one would be). The
report runs in a child process started from ``--repo`` (this checkout by default), and its
peak resident set size is that child's own high-water mark (VmHWM), so neither the parent
nor other processes of the machine can count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def record(n_layers: int) -> str:
    spec = {"target": "nsa", "n_layers": n_layers, "seq_len": 2048, "out_dir": f"trial-{n_layers}"}
    return json.dumps({"schema_version": 1, "spec": spec, "evidence": {
        "events": [], "result": {"step_s": [1.0], "steps_done": 1}},
        "verdict": {"name": "OK", "reasons": ["fine"], "facts": {}},
        "trial_dir": f"trial-{n_layers}", "wall_s": 1.0, "gpu": None})


def run_dir(parent: Path, gib: float) -> Path:
    run = parent / f"run-{gib:g}"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": "sweep-layers"}))
    with open(run / "trials.jsonl", "wb") as f:
        f.write(record(1).encode() + b"\n")
        if gib:
            f.truncate(f.tell() + int(gib * 2**30))
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
        f.write(record(2).encode() + b"\n")
    return run


PEAK_OF_REPORT = """
import atexit, sys
def peak():
    with open("/proc/self/status") as status:
        sys.stderr.write(next(line for line in status if line.startswith("VmHWM:")))
atexit.register(peak)
sys.argv = ["nsadiag", "report", sys.argv[1]]
from nsadiag.cli import main
main()
"""


def measure(repo: Path, run: Path) -> tuple[int, float, float]:
    """(exit code, peak RSS in MiB, seconds) of `nsadiag report RUN` from ``repo``: the
    process's own high-water mark (VmHWM), not ru_maxrss, which also counts the parent's
    resident set at the fork."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PEAK_OF_REPORT, str(run)], cwd=repo, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = int(done.stderr.split("VmHWM:")[1].split()[0]) / 1024 if "VmHWM:" in done.stderr \
        else float("nan")
    return done.returncode, peak, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, nargs="+", default=[0, 0.25, 1, 4])
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args()
    print("| trials.jsonl line | exit code | peak RSS | time |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for gib in args.gib:
            code, peak, seconds = measure(args.repo.resolve(), run_dir(Path(tmp), gib))
            print(f"| {gib:g} GiB | {code} | {peak:.0f} MiB | {seconds:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
