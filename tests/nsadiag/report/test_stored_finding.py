"""A run's Finding is decided once, when its record is made, and kept in record.json: the
report lays out the stored one and decides nothing; a stored finding that breaks its schema
is one RecordError line; a record.json written before findings were stored still renders,
its finding decided where it is loaded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import nsadiag.finding.run as run_findings
from nsadiag.finding.run import run_finding, with_finding
from nsadiag.findingdata import Culprit, Finding, Item
from nsadiag.report.dispatch import render_run
from nsadiag.rundir import RecordError, TrialRecord
from tests.helpers import check_result, evidence_of, trial_record


def _record(run: Path) -> TrialRecord:
    record = trial_record({"command": ["python", "train.py"], "stall_timeout_s": 60.0,
                           "deadline_s": 60.0}, None, "ERROR", str(run),
                          facts={"exception_type": "RuntimeError", "message": "boom"})
    record.evidence = evidence_of(record.spec, {**record.evidence.to_dict(),
                                                "outcome": {"exit_code": 1}})
    return record


def _plant(run: Path, record: TrialRecord) -> Path:
    run.mkdir(exist_ok=True)
    (run / "run.json").write_text(json.dumps({"command_name": "run"}))
    (run / "record.json").write_text(json.dumps(record.to_dict(), indent=1) + "\n")
    return run


def _never_decided(*args, **kwargs):
    raise AssertionError("the report decided a finding the record carries")


def test_a_stored_finding_reads_back_as_the_same_typed_finding_byte_for_byte(tmp_path):
    record = with_finding(_record(tmp_path))
    assert record.finding == run_finding(_record(tmp_path))
    stored = json.dumps(record.to_dict(), indent=1)
    back = TrialRecord.from_dict(json.loads(stored))
    assert isinstance(back.finding, Finding) and back.finding == record.finding
    assert json.dumps(back.to_dict(), indent=1) == stored
    # a record without one (a trials.jsonl line) writes no finding key at all
    assert "finding" not in _record(tmp_path).to_dict()


def test_the_report_lays_out_the_stored_finding_and_decides_none(tmp_path, monkeypatch):
    planted = Finding(command="run", verdict="ERROR", kind="crashed", status="failure",
                      headline="ERROR (crashed): the stored headline", subject="`train.py`",
                      next_action="The stored next step.",
                      culprit=Culprit("train.py", 7, "the stored line"),
                      proof="the stored proof", results=[Item("fail", "the stored result")])
    run = _plant(tmp_path / "run", dataclasses.replace(_record(tmp_path / "run"),
                                                       finding=planted))
    monkeypatch.setattr(run_findings, "run_finding", _never_decided)
    rendered = render_run(run)
    assert rendered.headline == "ERROR (crashed): the stored headline"
    assert rendered.summary["finding"] == planted.to_dict()
    text = rendered.report.read_text()
    assert "The stored next step." in text and "the stored proof" in text
    assert "`train.py:7`" in text


def test_a_record_json_written_before_findings_were_stored_gets_the_same_report(tmp_path):
    older = _plant(tmp_path / "run", _record(tmp_path / "run"))
    assert "finding" not in json.loads((older / "record.json").read_text())
    decided_at_load = render_run(older)
    md, summary = decided_at_load.report.read_text(), decided_at_load.summary
    _plant(older, with_finding(_record(older)))
    stored = render_run(older)
    assert stored.report.read_text() == md and stored.summary == summary
    assert summary["finding"]["proof"] == "RuntimeError: boom"


@pytest.mark.parametrize("broken, named", [
    ({"kind": "sort of stuck"}, "finding at $.kind: 'sort of stuck' is not one of"),
    ({"headline": None}, "finding at $.headline: None is not of type 'string'"),
    ({"results": [{"mark": "maybe", "text": "x"}]}, "finding at $.results[0].mark"),
])
def test_a_stored_finding_off_its_schema_is_one_record_error_line(tmp_path, broken, named):
    run = _plant(tmp_path / "run", with_finding(_record(tmp_path / "run")))
    data = json.loads((run / "record.json").read_text())
    data["finding"].update(broken)
    (run / "record.json").write_text(json.dumps(data))
    with pytest.raises(RecordError) as refused:
        render_run(run)
    line = str(refused.value)
    assert line.startswith(f"not a trial record ({named}") and "\n" not in line
    del data["finding"]["headline"]
    with pytest.raises(RecordError, match=r"^not a trial record \(finding at \$: "
                                          r"'headline' is a required property\)$"):
        TrialRecord.from_dict(data)


# ---- the kinds that keep their finding in their own JSON file ------------------------------

PLANTED = Finding(command="x", verdict="MEASURED", kind="measured", status="measured",
                  headline="MEASURED (measured): the stored headline", subject="the target",
                  next_action="The stored next step.")
MEMORY = {"device": "cpu", "saved_total": 4096, "step_s": 0.5, "peak_rss": 1 << 30,
          "saved_by_module": {"blocks.0": 4096}, "saved_by_branch": {"sel": 4096},
          "per_layer": [{"layer": "blocks.0", "saved": 4096, "cuda_delta": None}],
          "layer_standouts": [], "largest_saved": [],
          "cuda": "not a CUDA device", "history": {"unavailable": "not a CUDA device"}}


STACKS = {"processes": [{"pid": 4242, "rank": None, "cmdline": "python train.py",
                         "state": "waiting", "cpu_fraction": 0.0,
                         "signature": "acquire (train.py:7)", "unavailable": [],
                         "samples": []}],
          "clusters": [{"signature": "acquire (train.py:7)", "members": [4242]}],
          "odd_ones_out": []}


def _checks() -> dict:
    return {"spec": {"target": "nsa", "seq_len": 16}, "world_size": 2,
            "results": [{k: v for k, v in check_result("ckpt", "OK").items()
                         if k != "finished"}]}


def _plant_kind(run: Path, kind: str, name: str, stored: dict) -> Path:
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": kind, "argv": [
        "nsadiag", kind], "spec": {"target": "nsa", "seq_len": 16}}))
    (run / name).write_text(json.dumps(stored))
    return run


@pytest.mark.parametrize("kind, name, stored", [
    ("check", "checks.json", _checks()), ("memory", "memory.json", MEMORY),
    ("stacks", "stacks.json", STACKS)])
def test_a_kind_that_keeps_its_finding_in_its_file_renders_the_kept_one(
        tmp_path, kind, name, stored):
    older = render_run(_plant_kind(tmp_path / "older", kind, name, stored))
    decided = older.summary["finding"]
    assert decided["command"] == kind  # decided where it was loaded: the stored files had none
    kept = render_run(_plant_kind(tmp_path / "kept", kind, name, {
        **stored, "finding": {**decided, "headline": "kept: the stored headline"}}))
    assert kept.headline == "kept: the stored headline"
    assert {**kept.summary["finding"], "headline": decided["headline"]} == decided
    planted = render_run(_plant_kind(tmp_path / "planted", kind, name,
                                     {**stored, "finding": PLANTED.to_dict()}))
    assert planted.summary["finding"] == PLANTED.to_dict()
    assert "The stored next step." in planted.report.read_text()
    broken = _plant_kind(tmp_path / "broken", kind, name, {
        **stored, "finding": {**PLANTED.to_dict(), "status": "fine"}})
    with pytest.raises(RecordError, match=rf"^{name}: a stored record is malformed \(finding "
                                          rf"at \$.status: 'fine' is not one of"):
        render_run(broken)
