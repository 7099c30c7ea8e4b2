"""Peak memory of `nsadiag report` against the size of trials.jsonl.

    python bench/bench_report_memory.py                  # 0, 0.25, 1 and 4 GiB; prints a table
    python bench/bench_report_memory.py --gib 1 --repo ../other-checkout

Each run directory holds two valid trial records with one line of N GiB between them (NUL
bytes in a sparse file: no disk is used, and the line is read as a real one would be). The
report runs in a child process started from ``--repo`` (this checkout by default), and its
peak resident set size is that child's own ru_maxrss (os.wait4), so other processes of the
machine cannot count.
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


def measure(repo: Path, run: Path) -> tuple[int, float, float]:
    """(exit code, peak RSS in MiB, seconds) of `nsadiag report RUN` from ``repo``."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "report", str(run)],
                            cwd=repo, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024, \
        time.monotonic() - started


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
