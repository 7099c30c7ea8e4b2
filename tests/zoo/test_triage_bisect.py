"""Knob bisection end to end: dense O(S^2) masks under a memory cap fail at 4096 tokens and
pass at the baseline's 64, so delta debugging names seq_len as the minimal failing change."""

import json

from tests.helpers import nsadiag


def test_dense_masks_bisect_to_the_sequence_length(tmp_path):
    out = tmp_path / "run"
    done = nsadiag("triage", "--target", "repro.dense_masks:make", "--seq-len", "4096",
                   "--memory-cap-mb", "1280", "--max-layers", "1", "--max-minutes", "10",
                   "--stall-timeout", "60", "--no-checks", "--out", str(out), timeout=400)
    assert done.returncode == 1, (done.stdout, done.stderr)
    summary = json.loads((out / "summary.json").read_text())
    failure = summary["failure"]
    assert failure["verdict"] == "OOM" and failure["n_layers"] == 1
    assert failure["minimal"] == {"seq_len": 4096}
    state = json.loads((out / "triage.json").read_text())
    bisection = state["bisection"]
    assert bisection["changes"] == {"seq_len": 4096}
    assert bisection["baseline"] == {"seq_len": 64}
    assert [(t["applied"], t["verdict"]) for t in bisection["tests"]] == [([], "OK")]
    report = (out / "report.md").read_text()
    assert "seq_len=4096: with seq_len=64 instead, the failure goes away" in report
    assert "--seq-len 4096" in report and "--memory-cap-mb 1280" in report
