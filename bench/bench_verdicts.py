"""Verdicts on a quiet and on a loaded machine: the fault zoo and the plain scripts.

    python bench/bench_verdicts.py [--only NAME ...] [--conditions quiet,loaded]
                                   [--out reports/verdicts-under-load.md] [--json PATH]
                                   [--from-json PATH ...]

Diagnoses every fault-zoo entry (repro.ZOO, as `nsadiag env --self-test` does) and runs
every script of repro/scripts/ under `nsadiag run` with the options its docstring gives,
first without added load ("quiet": whatever else the machine runs), then with two
`python -c 'while True: pass'` burners (started here and killed at the end). Prints one
row per entry: the expected verdict and, per condition, the verdict got and the time to
it (a zoo entry's trial or check; a script's whole `nsadiag run`, start-up included).
With --out, writes the table and the load averages into that Markdown file, above its
"## What the progress sampler costs" section, which is kept. --json keeps the results;
--from-json writes the table from results kept by earlier runs (parts of the entries, in
the order given, each part's condition measured in one go) instead of measuring.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "repro" / "scripts"
KEPT_FROM = "## What the progress sampler costs"

# script -> (expected verdict, nsadiag run options, the command after --, as its docstring)
SCRIPT_RUNS: dict[str, tuple[str, list[str], list[str]]] = {
    "slow_token_loop.py": ("SLOW", ["--deadline", "20"], ["python", "{script}"]),
    "grad_hook_deadlock.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "ddp_extra_allreduce.py": ("STALL-COLLECTIVE", ["--stall-timeout", "10"],
                               ["torchrun", "{script}"]),
    "new_session_helper.py": ("OK", [], ["python", "{script}"]),
    "dataloader_worker_hang.py": ("DEADLOCK", ["--stall-timeout", "5"],
                                  ["python", "{script}"]),
    "ddp_collective_mismatch.py": ("CRASH", ["--stall-timeout", "10"],
                                   ["torchrun", "{script}"]),
    "producer_thread_dies.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "loss_history_leak.py": ("OOM", [], ["ulimit", "{script}"]),
}


def command(kind: str, script: Path) -> list[str]:
    """The command line of a script run: plain python, torchrun with two ranks, or python
    under a 2 GB address-space limit (`ulimit -v`, as a job scheduler sets one)."""
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", str(script)]
    if kind == "ulimit":
        return ["bash", "-c", f"ulimit -v 2000000; exec {sys.executable} {script}"]
    return [sys.executable, str(script)]


def run_script(name: str, out: Path) -> dict[str, Any]:
    expected, options, (kind, _) = SCRIPT_RUNS[name]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nsadiag.cli", "run", *options, "--out",
                           str(out), "--", *command(kind, SCRIPTS / name)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    try:
        summary = json.loads((out / "summary.json").read_text())
        got, reason = summary["verdict"], summary["headline"]
    except (OSError, ValueError, KeyError):
        got, reason = f"exit {done.returncode}", done.stderr.strip()[-300:]
    return {"entry": name, "kind": "script", "expected": expected, "got": got,
            "match": got == expected, "reason": reason, "seconds": seconds}


def run_zoo(name: str) -> dict[str, Any]:
    from nsadiag.commands.selftest import self_test

    [row] = self_test(only=[name])
    return {**row, "kind": "zoo"}


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def one_condition(names: list[str], burners: int) -> dict[str, Any]:
    from repro import ZOO

    started: list[subprocess.Popen] = []
    rows = []
    try:
        for _ in range(burners):
            started.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        if burners:
            time.sleep(5.0)  # let the load average see them
        load_start = loadavg()
        with tempfile.TemporaryDirectory(prefix="bench-verdicts-") as tmp:
            for name in names:
                row = run_zoo(name) if name in ZOO else run_script(name, Path(tmp) / name)
                rows.append(row)
                print(f"{'loaded' if burners else 'quiet '} {row['entry']:<28} "
                      f"{row['expected']:<17} {row['got']:<17} {row['seconds']:6.1f} s",
                      flush=True)
        load_end = loadavg()
    finally:
        for process in started:
            process.kill()
            process.wait()
    return {"burners": burners, "load": [load_start, load_end], "rows": rows}


def merged(parts: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Results measured in parts, one condition's rows after another's, with the range of
    the load averages read at the parts' starts and ends, and the ends apart (a 1-minute
    average read as the burners start does not show them yet)."""
    conditions: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, found in part.items():
            into = conditions.setdefault(name, {"burners": found["burners"],
                                                "load": list(found["load"]), "rows": [],
                                                "ends": []})
            into["rows"] += found["rows"]
            into["ends"] += found.get("ends") or [found["load"][1]]
            readings = [*into["load"], *found["load"]]
            into["load"] = [min(readings), max(readings)]
    return conditions


def table(conditions: dict[str, dict[str, Any]]) -> list[str]:
    names = [row["entry"] for row in next(iter(conditions.values()))["rows"]]
    heads = {"quiet": "no added load", "loaded": "two burners"}
    def load(found: dict[str, Any]) -> str:
        ends = found.get("ends") or [found["load"][1]]
        return f"{min(ends):.1f}-{max(ends):.1f}" if len(ends) > 1 else f"{ends[0]:.1f}"

    header = "| entry | expected | " + " | ".join(
        f"{heads[c]} (load {load(d)})" for c, d in conditions.items()) + " |"
    lines = [header, "|---|---|" + "---|" * len(conditions)]
    for index, name in enumerate(names):
        rows = [d["rows"][index] for d in conditions.values()]
        label = name if rows[0]["kind"] == "zoo" else f"scripts/{name}"
        cells = [f"{r['got']} ({r['seconds']:.1f} s)" + ("" if r["match"] else " **wrong**")
                 for r in rows]
        lines.append(f"| {label} | {rows[0]['expected']} | " + " | ".join(cells) + " |")
    return lines


def write_report(path: Path, conditions: dict[str, dict[str, Any]]) -> None:
    kept = ""
    if path.exists() and KEPT_FROM in path.read_text():
        kept = path.read_text()[path.read_text().index(KEPT_FROM):]
    import torch

    cpus = len(os.sched_getaffinity(0))
    wrong = sum(not r["match"] for d in conditions.values() for r in d["rows"])
    totals = ", ".join(f"{c} {sum(r['seconds'] for r in d['rows']):.0f} s"
                       for c, d in conditions.items())
    text = [
        "# Verdicts on a quiet and on a loaded machine", "",
        f"Measured on {time.strftime('%Y-%m-%d')} by `bench/bench_verdicts.py` on {cpus} "
        f"CPUs (torch {torch.__version__}, no GPU): every fault-zoo entry diagnosed in a "
        f"watched child (as `nsadiag env --self-test` does; the time is the trial's or the "
        f"check's), and every script of `repro/scripts/` run under `nsadiag run` with the "
        f"options its docstring gives (the time is the whole `nsadiag run`, from start to "
        f"the verdict), first with no load added, then with two `python -c 'while True: "
        f"pass'` burners. The machine is shared with other work, so the column without added "
        f"load is not a quiet machine: each column gives the 1-minute load averages read at the "
        f"end of its runs (measured in parts, the lowest and the highest).", "",
        *table(conditions), "",
        f"Time in all: {totals}. Verdicts other than expected: {wrong}.", "",
    ]
    path.write_text("\n".join(text) + ("\n" + kept if kept else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--conditions", default="quiet,loaded")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--from-json", type=Path, nargs="*", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from repro import ZOO

    names = [*ZOO, *SCRIPT_RUNS]
    if args.only:
        names = [name for name in names if name in args.only]
    if args.from_json:
        conditions = merged([json.loads(path.read_text()) for path in args.from_json])
    else:
        conditions = {c: one_condition(names, 2 if c == "loaded" else 0)
                      for c in args.conditions.split(",")}
    if args.json:
        args.json.write_text(json.dumps(conditions, indent=1))
    if args.out:
        write_report(args.out, conditions)


if __name__ == "__main__":
    main()
