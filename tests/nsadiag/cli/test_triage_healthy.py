"""nsadiag triage on the built-in NSA target: checks pass, every depth is OK, exit 0; the
same run against a faster baseline is a regression, exit 3 (the rerun resumes its trials)."""

import json

from nsadiag.finding import Finding
from tests.helpers import nsadiag
from tests.readable import assert_readable

TINY = ["--set", "dim=32", "--set", "n_heads=4", "--set", "n_kv_heads=2", "--set",
        "head_dim=8", "--set", "l=8", "--set", "d=4", "--set", "l_sel=16", "--set", "n_sel=3",
        "--set", "w=16", "--seq-len", "64", "--steps", "2", "--stall-timeout", "60",
        "--max-minutes", "6"]


def triage(*args):
    """nsadiag triage of the built-in target at TINY's settings."""
    return nsadiag("triage", *TINY, *args, timeout=500)


def test_builtin_target_is_healthy_then_regressed_against_a_faster_baseline(tmp_path):
    out = tmp_path / "run"
    done = triage("--max-layers", "2", "--out", str(out))
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "healthy" and summary["failure"] is None
    assert summary["deepest_ok"] == 2 and summary["threshold"] is None
    assert [(v["n_layers"], v["verdict"]) for v in summary["verdicts"]] == [(1, "OK"), (2, "OK")]
    assert {c["name"]: c["verdict"] for c in summary["checks"]} == {
        "causality": "OK", "parity": "OK", "ckpt": "OK"}
    report = (out / "report.md").read_text()
    finding = Finding.from_dict(summary["finding"])
    assert (finding.verdict, finding.kind, finding.culprit) == ("OK", "healthy", None)
    assert report.startswith("# nsadiag triage: ✅ OK (healthy): OK up to 2 layer(s)")
    assert_readable(report, finding, None)
    assert all(item.mark == "ok" for item in finding.results), finding.results
    assert "### Correctness checks" in report and "![time and memory" in report

    # a baseline 100x faster (against its expected cost too: the code, not the machine)
    # and smaller than this run: both quantities regress
    baseline = json.loads((out / "summary.json").read_text())
    for row in baseline["rows"]:
        row["step_s"] /= 100
        row["cost_ratio"] /= 100
        row["peak_rss"] //= 100
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))
    trials = (out / "trials.jsonl").read_text()
    regressed = triage("--max-layers", "2", "--no-checks", "--baseline",
                       str(tmp_path / "baseline.json"), "--out", str(out))
    assert regressed.returncode == 3, (regressed.stdout, regressed.stderr)
    assert (out / "trials.jsonl").read_text() == trials, "the rerun did not resume"
    summary = json.loads((out / "summary.json").read_text())
    assert {(r["n_layers"], r["quantity"]) for r in summary["regression"]["regressions"]} == {
        (1, "step_s"), (1, "peak_rss"), (2, "step_s"), (2, "peak_rss")}
    assert "## Regression against the baseline" in (out / "report.md").read_text()

    # the same run as its own baseline: no regression, exit 0
    (tmp_path / "same.json").write_text((out / "summary.json").read_text())
    same = triage("--max-layers", "2", "--no-checks", "--baseline", str(tmp_path / "same.json"),
                  "--out", str(out))
    assert same.returncode == 0, (same.stdout, same.stderr)


def test_builtin_target_with_more_steps_than_its_budget_is_slow_by_size_and_healthy(tmp_path):
    # 2000 steps cannot finish in 10 s on any machine: SLOW; the NSA model does its work
    # without per-token reads or loops of per-token ops, so slow by size: no failure, exit 0
    out = tmp_path / "run"
    done = nsadiag("triage", *TINY[:-6], "--steps", "2000", "--stall-timeout", "60",
                   "--budget", "10", "--max-minutes", "3", "--max-layers", "1", "--no-checks",
                   "--out", str(out), timeout=400)
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "healthy" and summary["failure"] is None
    assert [(v["n_layers"], v["verdict"]) for v in summary["verdicts"]] == [(1, "SLOW")]
    assert "slow by size from 1 layer(s)" in summary["headline"]
    assert summary["finding"]["kind"] == "slow by size" and summary["finding"]["culprit"] is None
    record = json.loads((out / "trials.jsonl").read_text().splitlines()[0])
    assert record["verdict"]["facts"]["slow_by"] == "size"
