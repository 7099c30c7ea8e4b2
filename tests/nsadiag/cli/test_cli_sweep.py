"""nsadiag sweep-layers / isolate-branch / report end to end, and every usage error."""

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import nsadiag
from tests.procs import wait_for

TINY = ["--set", "dim=32", "--set", "n_heads=4", "--set", "n_kv_heads=2", "--set",
        "head_dim=8", "--set", "l=8", "--set", "d=4", "--set", "l_sel=16", "--set", "n_sel=3",
        "--set", "w=16", "--seq-len", "64", "--steps", "2", "--stall-timeout", "20"]


def test_sweep_layers_reports_every_count_ok_with_fits_and_plot(tmp_path):
    out = tmp_path / "run"
    done = nsadiag("sweep-layers", "--layers", "1-3", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [v["verdict"] for v in summary["verdicts"]] == ["OK", "OK", "OK"]
    assert [r["n_layers"] for r in summary["rows"]] == [1, 2, 3]
    assert all(r["saved_bytes"] > 0 for r in summary["rows"])
    # more layers save more for backward, about the same amount per layer
    saved = [r["saved_bytes"] for r in summary["rows"]]
    assert saved[0] < saved[1] < saved[2]
    assert abs((saved[2] - saved[1]) - (saved[1] - saved[0])) < 0.1 * (saved[1] - saved[0])
    fit = summary["fits"]["sweep-layers"]["saved_bytes"]
    assert fit["r2"] > 0.99 and set(fit["extrapolated"]) == {"4", "5"}
    report = (out / "report.md").read_text()
    assert report.startswith("# nsadiag sweep-layers: ✅ OK (healthy): every trial OK up to "
                             "3 layers")
    for section in ("## Summary", "## Results", "## Configuration", "## Measurements",
                    "## Evidence", "## Root cause", "Ruled out:", "Implicated:",
                    "## Minimal reproduction", "## Recommendations"):
        assert section in report
    assert (out / "sweep.png").stat().st_size > 1000
    assert len((out / "trials.jsonl").read_text().splitlines()) == 3
    # decided once as the sweep ended and kept beside its trials; the report lays it out
    kept = json.loads((out / "finding.json").read_text())
    assert kept["finding"]["headline"] == summary["headline"] and kept["machine_memory"] > 0

    # a rerun in the same directory resumes: nothing new is run
    again = nsadiag("sweep-layers", "--layers", "1-3", *TINY, "--out", str(out))
    assert again.returncode == 0
    assert len((out / "trials.jsonl").read_text().splitlines()) == 3

    # report re-renders from the stored trials
    (out / "report.md").unlink()
    rendered = nsadiag("report", str(out))
    assert rendered.returncode == 0 and (out / "report.md").read_text() == report


def test_isolate_branch_slow_by_size_is_no_failure_and_exits_0(tmp_path):
    # 2000 steps cannot finish in 10 s on any machine: SLOW; the NSA model does its work
    # without per-token reads or loops of per-token ops, so by size: no failure anywhere
    out = tmp_path / "iso"
    done = nsadiag("isolate-branch", "win", "--layers", "1", *TINY[:-6], "--steps", "2000",
                   "--budget", "10", "--stall-timeout", "60", "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    if done.returncode == 4:
        # a machine so busy that contention alone could explain the time: the verdict says
        # so with the load figures rather than guessing size or defect
        finding = summary["finding"]
        assert finding["verdict"] == "INCONCLUSIVE", (done.stdout, done.stderr)
        assert "per usable CPU" in finding["proof"] or "of the CPU it asked" in finding["proof"]
        return
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert [(v["label"], v["verdict"], v["slow_by"]) for v in summary["verdicts"]] == [
        ("all branches", "SLOW", "size"), ("win only", "SLOW", "size")]
    assert summary["headline"] == "SLOW (slow by size) from 1 layer: no failure"
    assert summary["finding"]["status"] == "healthy" and summary["threshold"] is None


def test_isolate_branch_attributes_time_to_the_branch(tmp_path):
    out = tmp_path / "iso"
    done = nsadiag("isolate-branch", "win", "--layers", "1-2", *TINY, "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    labels = [(r["label"], r["n_layers"]) for r in summary["rows"]]
    assert labels == [("all branches", 1), ("all branches", 2), ("win only", 1),
                      ("win only", 2)]
    rows = {(r["label"], r["n_layers"]): r for r in summary["rows"]}
    # the window branch alone saves less for backward than all three branches
    assert rows["win only", 2]["saved_bytes"] < rows["all branches", 2]["saved_bytes"]
    report = (out / "report.md").read_text()
    assert "What the win branch costs" in report
    # each layer count runs twice: the lines and the results say which run is which
    for label in ("all branches", "win only"):
        assert re.search(rf"^ +2 layers +S=64 +{label} +OK ", done.stderr, re.M), done.stderr
        assert f"**{label}**\n\n- ✅ 1 layer: OK" in report


@pytest.mark.parametrize("args,message", [
    (["sweep-layers", "--target", "no_such_pkg.mod:make"], "target: cannot import"),
    (["sweep-layers", "--target", "repro.per_token_loop:make", "--grad-ckpt"],
     "does not accept 'grad_ckpt'"),
    (["sweep-layers", "--layers", "5-2"], "layers:"),
    (["sweep-layers", "--layers", "x"], "layers:"),
    (["sweep-layers", "--stall-timeout", "0"], "stall-timeout:"),
    (["sweep-layers", "--budget", "-1"], "budget:"),
    (["sweep-layers", "--startup-grace", "0"], "startup-grace:"),
    (["sweep-layers", "--set", "d=5"], "d: must divide"),
    (["sweep-layers", "--set", "nope"], "--set: expected key=value"),
    (["sweep-layers", "--dtype", "int8"], "dtype:"),
    (["isolate-branch", "attn"], "branch:"),
    (["report", "/nonexistent/run"], "run_dir:"),
])
def test_usage_errors_are_one_line_exit_2(args, message, tmp_path):
    done = nsadiag(*args, "--out", str(tmp_path / "r")) if args[0] != "report" else \
        nsadiag(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r" / "trials.jsonl").exists()


def test_unwritable_output_directory_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = nsadiag("sweep-layers", "--out", str(blocker / "run"), *TINY)
    assert done.returncode == 2
    assert done.stderr.startswith("nsadiag: error: out: cannot write to")


def test_ctrl_c_kills_the_trial_and_keeps_finished_trials(tmp_path):
    import os
    import signal

    import psutil

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "sweep-layers", "--target",
                             "repro.per_token_loop:make", "--layers", "1,2", "--seq-len", "512",
                             "--steps", "200", "--stall-timeout", "60", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        events = out / "trial-0" / "events.jsonl"
        wait_for(lambda: events.exists() and '"kind":"module"' in events.read_text(), 120,
                 "the trial child to train")
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the trial child should be running"
        os.kill(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    # nothing had finished: the interrupted trial is recorded as such, and reported
    (record,) = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert record["verdict"]["name"] == "INCONCLUSIVE"
    assert record["evidence"]["interrupted"]["signal"] == "SIGINT"
    assert "interrupted by the user (Ctrl-C) at " in (out / "report.md").read_text()


def test_sweep_seq_reports_time_and_memory_against_the_sequence_length(tmp_path):
    out = tmp_path / "seq"
    done = nsadiag("sweep-seq", "--seq-lens", "32,64,128", "--layers", "1", *TINY[:-6],
                   "--steps", "2", "--stall-timeout", "20", "--out", str(out))
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert [(v["seq_len"], v["verdict"]) for v in summary["verdicts"]] == [
        (32, "OK"), (64, "OK"), (128, "OK")]
    saved = [row["saved_bytes"] for row in summary["rows"]]
    assert saved[0] < saved[1] < saved[2]  # activations grow with S
    assert set(summary["fits"]["sweep-seq"]) >= {"step_s", "peak_rss", "saved_bytes"}
    report = (out / "report.md").read_text()
    for text in ("# nsadiag sweep-seq: ✅ OK (healthy): every trial OK up to S=128",
                 "| S | verdict | step | peak RSS | "
                 "saved for backward | rest of the peak | steps |",
                 "### Fits against the sequence length"):
        assert text in report
    kept = json.loads((out / "finding.json").read_text())
    assert kept["finding"]["headline"] == summary["headline"]
    assert kept["machine_memory"] == summary["machine_memory"]
    peak = summary["fits"]["sweep-seq"]["peak_rss"]
    # the fit's prediction at 2x and 4x the longest length, beside this machine's memory
    assert ("Predicted peak" in report and "at S=256" in report) == (not peak["poor"])
    # the report re-renders from the stored trials
    (out / "report.md").unlink()
    assert nsadiag("report", str(out)).returncode == 0
    assert (out / "report.md").read_text() == report


def test_keep_going_runs_every_count_past_the_first_failure(tmp_path):
    # backward_error fails at any depth: without --keep-going the sweep stops at 1 layer
    args = ["sweep-layers", "--target", "repro.backward_error:make", "--layers", "1,2",
            "--seq-len", "16", "--steps", "1", "--stall-timeout", "20"]
    stopped = nsadiag(*args, "--out", str(tmp_path / "a"))
    assert stopped.returncode == 1
    assert len((tmp_path / "a" / "trials.jsonl").read_text().splitlines()) == 1
    going = nsadiag(*args, "--keep-going", "--out", str(tmp_path / "b"))
    assert going.returncode == 1
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert [v["verdict"] for v in summary["verdicts"]] == ["ERROR", "ERROR"]
