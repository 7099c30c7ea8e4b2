"""CI mode pieces without trials: exit codes, the step summary, run comparison, and every
usage error of triage and compare (exit 2, one line)."""

import json

import pytest

from nsadiag.ci import (
    EXIT_FAILURE,
    EXIT_HEALTHY,
    EXIT_REGRESSION,
    EXIT_USAGE,
    exit_code,
    write_step_summary,
)
from nsadiag.compare import compare_rows, compare_runs, load_summary
from tests.helpers import nsadiag


def _row(n_layers, step_s, peak_rss, verdict="OK", label="sweep"):
    return dict(label=label, n_layers=n_layers, verdict=verdict, step_s=step_s,
                peak_rss=peak_rss)


def test_exit_code_of_a_summary():
    assert exit_code({"status": "healthy"}) == EXIT_HEALTHY == 0
    assert exit_code({"status": "failure"}) == EXIT_FAILURE == 1
    assert EXIT_USAGE == 2
    regressed = {"status": "healthy", "regression": {"regressions": [{"quantity": "step_s"}]}}
    assert exit_code(regressed) == EXIT_REGRESSION == 3
    # a failure outranks a regression
    assert exit_code({**regressed, "status": "failure"}) == EXIT_FAILURE


def test_step_summary_is_appended_only_when_set(tmp_path):
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    assert write_step_summary("# report", {"GITHUB_STEP_SUMMARY": str(target)}) == target
    assert target.read_text() == "earlier step\n# report\n"
    assert write_step_summary("# report", {}) is None
    with pytest.raises(ValueError, match="GITHUB_STEP_SUMMARY"):
        write_step_summary("x", {"GITHUB_STEP_SUMMARY": str(tmp_path / "no" / "dir.md")})


def test_compare_rows_flags_growth_beyond_the_threshold():
    before = [_row(1, 1.0, 100), _row(2, 2.0, 200), _row(4, 4.0, 400)]
    after = [_row(1, 1.1, 100), _row(2, 2.5, 200), _row(4, 4.0, 400, verdict="SLOW"),
             _row(8, 9.0, 900)]
    deltas = {(d.n_layers, d.quantity): d for d in compare_rows(before, after, 0.2)}
    # a SLOW row's steps were timed all the same; its peak (a killed run's) is partial
    assert set(deltas) == {(1, "step_s"), (1, "peak_rss"), (2, "step_s"), (2, "peak_rss"),
                           (4, "step_s")}
    assert deltas[4, "step_s"].change == 0 and not deltas[4, "step_s"].regressed
    assert deltas[1, "step_s"].change == pytest.approx(0.1) and not deltas[1, "step_s"].regressed
    assert deltas[2, "step_s"].change == pytest.approx(0.25) and deltas[2, "step_s"].regressed
    assert not deltas[2, "peak_rss"].regressed
    with pytest.raises(ValueError, match="regression-threshold"):
        compare_rows(before, after, -0.1)


def _summary(path, rows):
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps({"headline": path.name, "rows": rows}))
    return path


def test_compare_command_exit_codes(tmp_path):
    a = _summary(tmp_path / "a", [_row(1, 1.0, 100), _row(2, 2.0, 200, verdict="OK")])
    same = _summary(tmp_path / "same", [_row(1, 1.05, 100), _row(2, 2.1, 200)])
    worse = _summary(tmp_path / "worse", [_row(1, 1.0, 100), _row(2, 2.0, 300, "SLOW"),
                                          _row(2, 2.0, 300, "OK", label="other")])
    ok = nsadiag("compare", str(a), str(same))
    assert ok.returncode == 0, ok.stderr
    slower = nsadiag("compare", str(a), str(same / "summary.json"), "--threshold", "0.01",
                     "--json")
    assert slower.returncode == 3
    result = json.loads(slower.stdout)
    assert {(d["n_layers"], d["quantity"]) for d in result["regressions"]} == {(1, "step_s"),
                                                                             (2, "step_s")}
    changed = compare_runs(a, worse)
    assert changed["verdict_changes"] == [{"label": "sweep", "n_layers": 2, "before": "OK",
                                           "after": "SLOW", "failure_now": True}]
    assert changed["only_after"] == [("other", 2)]
    # a verdict that fails where it did not is a regression of its own: exit 3
    assert nsadiag("compare", str(a), str(worse)).returncode == 3
    missing = nsadiag("compare", str(a), str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "summary: cannot read" in missing.stderr


def test_a_change_within_the_measured_spread_is_noise_not_a_regression():
    # +25 % on step time, but each run's own step times spread by 40 %: noise
    before = [{**_row(1, 1.0, 100), "step_s_spread": 0.4}]
    after = [{**_row(1, 1.25, 100), "step_s_spread": 0.1}]
    (delta, _) = compare_rows(before, after, 0.2)
    assert delta.quantity == "step_s" and delta.noise == pytest.approx(0.4)
    assert not delta.regressed
    steady = [{**_row(1, 1.0, 100), "step_s_spread": 0.05}]
    (delta, _) = compare_rows(steady, after, 0.2)
    assert delta.regressed and delta.noise == pytest.approx(0.1)


def test_runs_of_different_configurations_are_refused_unless_forced(tmp_path):
    a = _summary(tmp_path / "a", [_row(1, 1.0, 100)])
    b = _summary(tmp_path / "b", [_row(1, 4.0, 100)])
    spec = {"target": "nsa", "seq_len": 1024, "batch": 1, "dtype": "float32"}
    (a / "spec.json").write_text(json.dumps(spec))
    (b / "spec.json").write_text(json.dumps({**spec, "seq_len": 2048}))
    refused = nsadiag("compare", str(a), str(b))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "seq_len: 1024 -> 2048" in refused.stderr and "--force" in refused.stderr
    forced = compare_runs(a, b, force=True)
    assert forced["config_differences"] == ["seq_len: 1024 -> 2048"]
    assert forced["regressions"]


def test_load_summary_refuses_what_is_not_a_summary(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "other.json").write_text(json.dumps({"x": 1}))
    with pytest.raises(ValueError, match="not valid JSON"):
        load_summary(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="has no rows"):
        load_summary(tmp_path / "other.json")


@pytest.mark.parametrize("args,message", [
    (["--max-layers", "0"], "max-layers:"),
    (["--max-minutes", "0"], "max-minutes:"),
    (["--world-size", "0"], "world-size:"),
    (["--regression-threshold", "-1"], "regression-threshold:"),
    (["--baseline", "/nonexistent/summary.json"], "summary: cannot read"),
    (["--target", "no_such_pkg.mod:make"], "target: cannot import"),
    (["--target", "repro.per_token_loop:make", "--grad-ckpt"], "does not accept 'grad_ckpt'"),
    (["--dtype", "int8"], "dtype:"),
    (["--world-size", "2", "--ddp-backend", "mpi"], "backend:"),
])
def test_triage_usage_errors_are_one_line_exit_2(args, message, tmp_path):
    """In process (CliRunner) to spare a torch import per case; the subprocess path of the
    same fail() is covered by the compare test above."""
    from typer.testing import CliRunner

    from nsadiag.cli import app

    done = CliRunner().invoke(app, ["triage", *args, "--out", str(tmp_path / "run")])
    assert done.exit_code == 2, (done.exit_code, done.output)
    assert message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "trials.jsonl").exists()


def test_exit_codes_of_sweep_and_ddp_summaries_follow_their_verdicts():
    from nsadiag.ci import exit_code

    def sweep(*names):
        return {"command": "sweep-layers", "verdicts": [{"n_layers": i + 1, "verdict": n}
                                                        for i, n in enumerate(names)]}

    assert exit_code(sweep("OK", "OK")) == 0
    assert exit_code(sweep("OK", "INCONCLUSIVE")) == 4
    assert exit_code(sweep("OK", "INCONCLUSIVE", "OOM")) == 1
    assert exit_code({"command": "ddp", "verdict": "STALL-COLLECTIVE"}) == 1
    assert exit_code({"command": "ddp", "verdict": "OK"}) == 0
    assert exit_code({"status": "inconclusive"}) == 4
    assert exit_code({"status": "inconclusive",
                      "regression": {"regressions": [{"quantity": "step_s"}]}}) == 3


def test_a_slower_step_that_its_expected_cost_explains_is_the_machine_not_a_regression():
    # +50 % step time; the same step over its expected cost (the dense reference's time for
    # its FLOPs, timed in each run): 12x before, 12.5x after: the machine got slower
    before = [{**_row(1, 1.0, 100), "cost_ratio": 12.0}]
    busy = [{**_row(1, 1.5, 100), "cost_ratio": 12.5}]
    (delta, _) = compare_rows(before, busy, 0.2)
    assert delta.change == pytest.approx(0.5) and delta.cost_change == pytest.approx(0.5 / 12)
    assert delta.explained and not delta.regressed
    # the code got slower: the step grew against its expected cost too
    slower = [{**_row(1, 1.5, 100), "cost_ratio": 18.0}]
    (delta, _) = compare_rows(before, slower, 0.2)
    assert delta.regressed and not delta.explained
    assert delta.cost_change == pytest.approx(0.5)
    # a run that did not measure it falls back on the step time alone
    (delta, _) = compare_rows([_row(1, 1.0, 100)], busy, 0.2)
    assert delta.regressed and delta.cost_change is None
