"""Time from the stall timeout to the verdict, for a stuck run under `nsadiag run`.

    python bench/bench_time_to_verdict.py [--cases single,twohosts] [--runs 3]
                                          [--conditions quiet,loaded] [--stall-timeout 10]
                                          [--json PATH] [--from-json PATH ...] [--out PATH]
                                          [--keep DIR]

Cases:
single    one process: repro/scripts/two_locks_opposite_order.py (two threads take two locks
          in opposite order), under one `nsadiag run`;
twohosts  two hosts on one machine (tests/twohosts.py: PID, UTS and mount namespaces, needs
          root and unshare), a 2 x 2 torchrun job whose rank 3 polls forever for a file
          (tests/multihost_train.py), one `nsadiag run` per host, equal stall timeouts.

Each case runs first without added load ("quiet": whatever else the machine runs), then
with two `python -c 'while True: pass'` burners (started here, killed at the end of the
condition). For every host's run directory the times are read from what the run wrote:

stall     when the stall timeout ran out: the last progress the first host's clock saw
          (its stop minus the quiet time its stall evidence records) plus the stall
          timeout;
stop      when this host's clock said stop (the record's outcome.ended_at); the stall
          capture starts then;
decided   record.json written: the verdict decided and recorded;
report    report.md written.

Each is printed in seconds after `stall`, with the 1-min load average read when the run
ended. --out writes the table as Markdown; --json keeps the rows, --from-json writes the
table from rows kept earlier instead of measuring; --keep keeps every run directory under
DIR (outside /tmp for twohosts: each simulated host covers /tmp with its own tmpfs).
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SINGLE_SCRIPT = REPO / "repro" / "scripts" / "two_locks_opposite_order.py"
TWO_HOST_SCRIPT = REPO / "tests" / "multihost_train.py"
RUN_LIMIT_S = 300.0


def clock_readings(run_dir: Path) -> tuple[float, float] | None:
    """When this host's clock said stop (wall time) and the quiet time it had seen then, as
    its record keeps them (None when the run was not stopped at a stall)."""
    evidence = json.loads((run_dir / "record.json").read_text())["evidence"]
    stall = evidence.get("stall") or {}
    stopped = (evidence.get("outcome") or {}).get("ended_at")
    quiet = stall.get("since_last_event_s")
    return None if stopped is None or quiet is None else (float(stopped), float(quiet))


def stall_moment(run_dirs: list[Path], stall_timeout: float) -> float | None:
    """The job's stall timeout ran out when the first host's clock could say stop: its last
    progress (stop minus the quiet time) plus the stall timeout."""
    moments = [stopped - quiet + stall_timeout for stopped, quiet in
               filter(None, (clock_readings(d) for d in run_dirs
                             if (d / "record.json").exists()))]
    return min(moments, default=None)


def host_times(run_dir: Path, stall_at: float) -> dict[str, Any]:
    record = json.loads((run_dir / "record.json").read_text())
    readings = clock_readings(run_dir)
    return {"verdict": record["verdict"]["name"],
            "stop_s": None if readings is None else readings[0] - stall_at,
            "decided_s": (run_dir / "record.json").stat().st_mtime - stall_at,
            "report_s": (run_dir / "report.md").stat().st_mtime - stall_at}


def _no_report(host: str) -> dict[str, Any]:
    return {"host": host, "verdict": "no report", "stop_s": None, "decided_s": None,
            "report_s": None}


def run_single(work: Path, stall_timeout: float) -> list[dict[str, Any]]:
    out = work / "run"
    subprocess.run([sys.executable, "-m", "nsadiag.cli", "run", "--stall-timeout",
                    f"{stall_timeout:g}", "--no-redact", "--out", str(out), "--",
                    sys.executable, str(SINGLE_SCRIPT)], cwd=REPO, capture_output=True,
                   timeout=RUN_LIMIT_S, check=False)
    stall_at = stall_moment([out], stall_timeout)
    if stall_at is None or not (out / "report.md").exists():
        return [_no_report("-")]
    return [{"host": "-", **host_times(out, stall_at)}]


def run_two_hosts(work: Path, stall_timeout: float) -> list[dict[str, Any]]:
    from tests.twohosts import free_port, kill_host, make_hosts, start_host, torchrun

    hosts = make_hosts(work)
    command = torchrun(TWO_HOST_SCRIPT, hosts[0], free_port(hosts[0].address),
                       "--stuck-rank", "3")
    try:
        for host in hosts:
            start_host(host, ["--stall-timeout", f"{stall_timeout:g}", "--no-redact"],
                       command)
        for host in hosts:
            host.communicate(timeout=RUN_LIMIT_S)
    finally:
        for host in hosts:
            if host.proc is not None and host.proc.poll() is None:
                kill_host(host)
                host.proc.communicate(timeout=60)
    stall_at = stall_moment([h.run_dir for h in hosts], stall_timeout)
    return [_no_report(host.name) if stall_at is None or not (host.run_dir / "report.md").exists()
            else {"host": host.name, **host_times(host.run_dir, stall_at)} for host in hosts]


CASES = {"single": run_single, "twohosts": run_two_hosts}


def one_condition(cases: list[str], runs: int, burners: int, stall_timeout: float,
                  keep: Path | None = None) -> list[dict[str, Any]]:
    started = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(burners)]
    condition = "loaded" if burners else "quiet"
    rows = []
    try:
        if burners:
            time.sleep(5.0)  # the load average starts to show the burners
        for case in cases:
            for index in range(runs):
                if keep is not None:
                    work = keep / f"{case}-{condition}-{index + 1}"
                    work.mkdir(parents=True)
                    found = CASES[case](work, stall_timeout)
                else:
                    with tempfile.TemporaryDirectory(prefix="nsadiag-ttv-") as scratch:
                        found = CASES[case](Path(scratch), stall_timeout)
                load = os.getloadavg()[0]
                for row in found:
                    row.update(case=case, condition=condition, run=index + 1, load_1min=load,
                               stall_timeout_s=stall_timeout)
                    rows.append(row)
                    print(format_row(row), flush=True)
    finally:
        for burner in started:
            burner.kill()
            burner.wait()
    return rows


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_row(row: dict[str, Any]) -> str:
    return (f"{row['case']:<9} {row['condition']:<6} run {row['run']} host {row['host']:<5} "
            f"{row['verdict']:<16} stop +{_seconds(row['stop_s'])} s  decided "
            f"+{_seconds(row['decided_s'])} s  report +{_seconds(row['report_s'])} s  "
            f"load {row['load_1min']:.2f}")


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | condition | run | host | verdict | stop (s) | decided (s) | "
             "report.md (s) | load 1-min |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['case']} | {row['condition']} | {row['run']} | {row['host']} | "
                     f"{row['verdict']} | +{_seconds(row['stop_s'])} | "
                     f"+{_seconds(row['decided_s'])} | +{_seconds(row['report_s'])} | "
                     f"{row['load_1min']:.2f} |")
    lines += ["", "| case | condition | report.md after the stall timeout: median (s) | "
              "max (s) | reports (one per host and run) |", "|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row["report_s"] is not None:
            groups.setdefault((row["case"], row["condition"]), []).append(row["report_s"])
    for (case, condition), values in groups.items():
        lines.append(f"| {case} | {condition} | {statistics.median(values):.1f} | "
                     f"{max(values):.1f} | {len(values)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="single,twohosts")
    parser.add_argument("--conditions", default="quiet,loaded")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stall-timeout", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--from-json", type=Path, nargs="*")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the run directories under this one")
    args = parser.parse_args()
    if args.from_json:
        rows = [row for path in args.from_json for row in json.loads(path.read_text())]
    else:
        cases = [c for c in args.cases.split(",") if c]
        unknown = [c for c in cases if c not in CASES]
        if unknown:
            sys.exit(f"bench_time_to_verdict: unknown case {unknown[0]!r} "
                     f"(known: {', '.join(CASES)})")
        rows = []
        for condition in args.conditions.split(","):
            rows += one_condition(cases, args.runs, 2 if condition == "loaded" else 0,
                                  args.stall_timeout, args.keep)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.write_text(table)


if __name__ == "__main__":
    main()
