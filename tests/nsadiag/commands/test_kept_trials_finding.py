"""The sweeps, `nsadiag ddp` and `nsadiag triage` decide their Finding once, as they end, and
keep it in the run directory's finding.json: the report lays out the kept one and decides
nothing; a resumed sweep (or triage) decides again from all its trials and replaces the
kept one; a run directory without finding.json (an older nsadiag) still renders, its
finding decided as it is loaded, to the same report. The trials are hand-built records (the
trial runner and the triage engine are replaced), so these tests run no trial."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import nsadiag.commands.ddp as ddp_command_module
import nsadiag.commands.triage as triage_command_module
import nsadiag.finding.ddp as ddp_findings
import nsadiag.finding.sweep as sweep_findings
import nsadiag.sweep as sweep_module
import nsadiag.triage.finding as triage_findings
from nsadiag.commands.ddp import ddp_command
from nsadiag.commands.sweep import isolate_branch, sweep_layers, sweep_seq
from nsadiag.commands.triage import triage
from nsadiag.findingdata import Finding
from nsadiag.report.dispatch import render_run
from nsadiag.rundir import FINDING_FILE, RecordError, append_record, load_records
from nsadiag.spec import TrialSpec
from nsadiag.triage.engine import TriageOptions
from tests.helpers import check_result, evidence_of, plain_spec, triage_state, trial_record

GIB = 2**30


def _record(run: Path, n_layers: int, seq_len: int = 64, verdict: str = "OK",
            branches: list[str] | None = None):
    """A finished trial at ``n_layers`` (and ``seq_len``): two steps whose time and peak
    grow with both; a failing verdict leaves no result."""
    name = f"trial-{n_layers}-{seq_len}" + ("-" + "-".join(branches) if branches else "")
    return _finished(plain_spec(n_layers, seq_len=seq_len, branches=branches), verdict,
                     str(run / name))


def _finished(spec: dict, verdict: str, trial_dir: str):
    """``_record``'s trial, of ``spec`` (the fields of a TrialSpec)."""
    n_layers, seq_len = spec["n_layers"], spec["seq_len"]
    result = {"status": "ok", "steps_done": 2,
              "step_s": [2.0, 0.01 * n_layers * seq_len, 0.01 * n_layers * seq_len],
              "peak_rss": GIB + n_layers * seq_len * 2**16} if verdict == "OK" else None
    return trial_record(spec, result, verdict, trial_dir,
                        reasons=[f"{verdict} at {n_layers} layers, S={seq_len}"])


def _no_trials(monkeypatch, verdicts: dict[int, str] | None = None) -> None:
    """The sweeps' trial runner replaced (nsadiag.sweep.run_trial): each trial is a
    hand-built record of the spec it is given (``verdicts`` by sequence length, OK
    otherwise), and the sweep's own loop appends, resumes and stops as on real trials."""
    def run_trial(spec: TrialSpec, on_events=None):
        return _finished(json.loads(spec.to_json()), (verdicts or {}).get(spec.seq_len, "OK"),
                         spec.out_dir or "trial")
    monkeypatch.setattr(sweep_module, "run_trial", run_trial)


def _kept(run: Path) -> dict:
    return json.loads((run / FINDING_FILE).read_text())


def _never_decided(*args, **kwargs):
    raise AssertionError("the report decided a finding the run directory keeps")


def _no_deciding(monkeypatch) -> None:
    for name in ("decide_sweep", "sweep_finding"):
        monkeypatch.setattr(sweep_findings, name, _never_decided)
    for name in ("ddp_finding", "trial_finding"):
        monkeypatch.setattr(ddp_findings, name, _never_decided)


BASE = TrialSpec(seq_len=64, steps=2, stall_timeout_s=5.0, budget_s=60.0, device="cpu")


def test_a_layer_sweep_keeps_its_finding_and_a_resume_decides_it_again(tmp_path, monkeypatch):
    _no_trials(monkeypatch)
    run = tmp_path / "sweep"
    first = sweep_layers(BASE, [1, 2, 3], run, ["nsadiag", "sweep-layers"])
    kept = _kept(run)
    assert kept["finding"]["headline"] == "OK (healthy): every trial OK up to 3 layers"
    assert kept["finding"] == first.summary["finding"]
    assert isinstance(kept["machine_memory"], int) and kept["machine_memory"] > 0
    # a rerun with more layers resumes: the three trials stay, a fourth is added, and the
    # finding is decided again from all four
    again = sweep_layers(BASE, [1, 2, 3, 4], run, ["nsadiag", "sweep-layers"])
    assert len(load_records(run / "trials.jsonl")) == 4
    assert _kept(run)["finding"]["headline"] == "OK (healthy): every trial OK up to 4 layers"
    assert again.headline == _kept(run)["finding"]["headline"]
    # the report of the directory lays out the kept finding and decides none
    _no_deciding(monkeypatch)
    (run / "report.md").unlink()
    rendered = render_run(run)
    assert rendered.summary == again.summary
    assert rendered.report.read_text().startswith(
        "# nsadiag sweep-layers: ✅ OK (healthy): every trial OK up to 4 layers")


def test_a_failing_sweep_over_s_keeps_the_failure_with_its_machine_memory(tmp_path,
                                                                         monkeypatch):
    _no_trials(monkeypatch, {256: "DEADLOCK"})
    run = tmp_path / "seq"
    done = sweep_seq(BASE.replace(n_layers=2), [32, 64, 128, 256], run,
                     ["nsadiag", "sweep-seq"])
    kept = _kept(run)
    assert kept["finding"]["verdict"] == "DEADLOCK"
    assert kept["finding"]["headline"].startswith("DEADLOCK (stuck) at S=256")
    assert done.summary["finding"] == kept["finding"]
    assert done.summary["machine_memory"] == kept["machine_memory"]
    # a report rendered later (on a machine of another size) keeps the memory the cliff was
    # decided against, and decides nothing
    kept["machine_memory"] = 3 * GIB
    (run / FINDING_FILE).write_text(json.dumps(kept))
    _no_deciding(monkeypatch)
    later = render_run(run)
    assert later.summary["machine_memory"] == 3 * GIB
    assert later.summary["finding"] == kept["finding"]


def test_isolate_branch_keeps_one_finding_for_both_runs(tmp_path, monkeypatch):
    _no_trials(monkeypatch)
    run = tmp_path / "iso"
    done = isolate_branch(BASE, "sel", [1, 2, 3], run, ["nsadiag", "isolate-branch", "sel"])
    kept = _kept(run)["finding"]
    assert kept["command"] == "isolate-branch" and kept["verdict"] == "OK"
    assert len(kept["results"]) == 6  # three depths with all branches, three with sel only
    assert done.summary["finding"] == kept


@pytest.mark.parametrize("kind", ["sweep-layers", "sweep-seq"])
def test_a_sweep_directory_without_finding_json_renders_the_same_report(tmp_path, kind):
    """An older nsadiag kept no finding.json: the report decides the finding as it loads
    the trials (against this machine's memory), to the report the kept finding gives."""
    run = tmp_path / "older"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": kind, "argv": [
        "nsadiag", kind]}))
    for n, s in ((1, 64), (2, 64), (3, 64)) if kind == "sweep-layers" else \
            ((2, 32), (2, 64), (2, 128)):
        append_record(run / "trials.jsonl", _record(run, n, s))
    late = render_run(run)
    assert not (run / FINDING_FILE).exists()
    assert late.summary["finding"]["verdict"] == "OK"
    markdown = late.report.read_text()
    sweep_findings.keep_sweep_finding(run, kind)
    kept = render_run(run)
    assert kept.summary == late.summary and kept.report.read_text() == markdown


def test_a_kept_sweep_finding_off_its_schema_or_memory_is_one_record_error_line(tmp_path):
    run = tmp_path / "sweep"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": "sweep-layers"}))
    append_record(run / "trials.jsonl", _record(run, 1))
    kept = sweep_findings.keep_sweep_finding(run, "sweep-layers")
    stored = _kept(run)
    (run / FINDING_FILE).write_text(json.dumps({**stored, "finding": {
        **kept.to_dict(), "status": "fine"}}))
    with pytest.raises(RecordError, match=r"^finding.json: a stored record is malformed "
                                          r"\(finding at \$.status: 'fine' is not one of"):
        render_run(run)
    (run / FINDING_FILE).write_text(json.dumps({**stored, "machine_memory": "lots"}))
    with pytest.raises(RecordError, match=r"^finding.json: machine_memory must be a "
                                          r"positive number of bytes, got 'lots'$"):
        render_run(run)
    (run / FINDING_FILE).write_text("[]")
    with pytest.raises(RecordError, match=r"^finding.json: .* is not a JSON object$"):
        render_run(run)


def _ddp_record(run: Path):
    record = _record(run, 1)
    record.evidence = evidence_of(record.spec, {**record.evidence.to_dict(),
                                                "ddp": {"world_size": 2, "backend": "gloo"}})
    return dataclasses.replace(record, trial_dir=str(run / "trial-0"))


def test_ddp_keeps_its_finding_and_the_report_lays_it_out(tmp_path, monkeypatch):
    run = tmp_path / "ddp"
    monkeypatch.setattr(ddp_command_module, "run_ddp_trial",
                        lambda spec, world_size, backend, **kw: _ddp_record(run))
    done = ddp_command(BASE.replace(n_layers=1), 2, "gloo", run, ["nsadiag", "ddp"])
    kept = Finding.from_dict(_kept(run)["finding"])
    assert kept.command == "ddp" and kept.verdict == "OK"
    assert kept.subject.endswith(", 2 ranks (gloo)")
    assert done.summary["finding"] == kept.to_dict()
    late_markdown = done.report.read_text()
    _no_deciding(monkeypatch)
    planted = dataclasses.replace(kept, headline="OK (healthy): the kept headline")
    (run / FINDING_FILE).write_text(json.dumps({"finding": planted.to_dict()}))
    rendered = render_run(run)
    assert rendered.headline == "OK (healthy): the kept headline"
    # the title carries the kept headline; every other line is the report of the same run
    title, *rest = rendered.report.read_text().splitlines()
    late_title, *late_rest = late_markdown.splitlines()
    assert title == late_title.replace(kept.headline, planted.headline) != late_title
    assert rest == late_rest


def test_a_ddp_directory_without_finding_json_renders_the_same_report(tmp_path, monkeypatch):
    run = tmp_path / "ddp"
    monkeypatch.setattr(ddp_command_module, "run_ddp_trial",
                        lambda spec, world_size, backend, **kw: _ddp_record(run))
    kept = ddp_command(BASE.replace(n_layers=1), 2, "gloo", run, ["nsadiag", "ddp"])
    (run / FINDING_FILE).unlink()
    late = render_run(run)
    assert late.summary == kept.summary
    assert late.report.read_text() == kept.report.read_text()


# ---- triage -------------------------------------------------------------------------------------


def _fake_triage(state):
    """The triage engine without trials: its run stores ``state`` in triage.json and the
    sweep's one OK trial in trials.jsonl, as the stages leave them."""
    class Triage:
        def __init__(self, base, options, run_dir, argv, callbacks=None, clock=None):
            self.run_dir = run_dir

        def run(self):
            append_record(self.run_dir / "trials.jsonl",
                          dataclasses.replace(_record(self.run_dir, 1),
                                              trial_dir=str(self.run_dir / "trial-0")))
            (self.run_dir / "triage.json").write_text(json.dumps(state.to_dict()))
            return state
    return Triage


def _failed_check_state():
    wrong = check_result("ckpt", "WRONG", module="blocks.0")
    return triage_state(checks={"n_layers": 2, "results": [wrong]})


@pytest.mark.parametrize("state", [triage_state(), _failed_check_state()],
                         ids=["healthy", "failed check"])
def test_triage_keeps_its_finding_and_the_report_lays_it_out(tmp_path, monkeypatch, state):
    monkeypatch.setattr(triage_command_module, "Triage", _fake_triage(state))
    run = tmp_path / "triage"
    done = triage(BASE.replace(n_layers=1), TriageOptions(max_layers=2), run,
                  ["nsadiag", "triage"])
    kept = _kept(run)
    assert kept["finding"] == done.summary["finding"]
    assert kept["finding"]["command"] == "triage"
    assert kept["finding"]["verdict"] == ("WRONG" if state.checks else "OK")
    assert isinstance(kept["machine_memory"], int)
    markdown = done.report.report.read_text()
    # laid out as kept, nothing decided
    monkeypatch.setattr(triage_findings, "triage_finding", _never_decided)
    (run / "report.md").unlink()
    again = render_run(run)
    assert again.summary == done.summary and again.report.read_text() == markdown
    # a rerun drops the kept finding as it starts (its trials may change), and keeps its own
    monkeypatch.undo()
    monkeypatch.setattr(triage_command_module, "Triage", _fake_triage(_failed_check_state()))
    triage(BASE.replace(n_layers=1), TriageOptions(max_layers=2), run, ["nsadiag", "triage"])
    assert _kept(run)["finding"]["verdict"] == "WRONG"


def test_a_triage_directory_without_finding_json_renders_the_same_report(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(triage_command_module, "Triage", _fake_triage(_failed_check_state()))
    run = tmp_path / "triage"
    kept = triage(BASE.replace(n_layers=1), TriageOptions(max_layers=2), run,
                  ["nsadiag", "triage"])
    (run / FINDING_FILE).unlink()
    late = render_run(run)
    assert late.summary == kept.summary
    assert late.report.read_text() == kept.report.report.read_text()
