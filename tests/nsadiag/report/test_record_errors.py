"""A stored record is parsed where it is read: one that does not parse is one RecordError
naming the file, and a fault met while rendering a parsed record goes up as itself."""

import json

import pytest

from nsadiag.report import dispatch
from nsadiag.report.dispatch import render_run
from nsadiag.rundir import RecordError, TrialRecord, append_record, load_records, parse_stored
from nsadiag.verdict import Verdict, VerdictName
from tests.helpers import REPO, check_result, one_step_record


def run_dir(tmp_path, command_name, **files):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": command_name}))
    for name, data in files.items():
        (run / name.replace("_", ".")).write_text(json.dumps(data))
    return run


def test_parse_stored_turns_a_missing_key_into_one_line_naming_the_file():
    with pytest.raises(RecordError, match=r"^checks.json: a stored record is malformed "
                                          r"\(KeyError: 'results'\)$"):
        parse_stored("checks.json", dispatch.checks, {"spec": {}, "world_size": 1})
    assert parse_stored("x.json", lambda d: d["a"], {"a": 3}) == 3


def test_a_record_json_off_the_trial_schema_is_refused_where_it_is_read(tmp_path):
    run = run_dir(tmp_path, "run", record_json={"spec": {"command": ["x"]}})
    with pytest.raises(RecordError, match="^not a trial record"):
        render_run(run)


def test_a_triage_json_whose_check_result_lacks_its_verdict_is_refused_at_load(tmp_path):
    broken = check_result("ckpt", "OK")
    del broken["verdict"]
    state = {"target": "nsa", "argv": ["nsadiag", "triage"], "max_layers": 2,
             "max_minutes": 10, "trial_budget_s": 40.0, "user_budget_s": 600.0,
             "stages_done": ["env", "checks"], "stopped": None, "base_spec": {},
             "world_size": 1, "elapsed_s": 5.0, "env": {}, "env_problems": [],
             "checks": {"n_layers": 1, "results": [broken]}}
    run = run_dir(tmp_path, "triage", triage_json=state)
    with pytest.raises(RecordError, match=r"^triage.json: a stored record is malformed "
                                          r"\(KeyError: 'verdict'\)"):
        render_run(run)


def test_a_run_json_field_of_the_wrong_type_is_one_line(tmp_path):
    run = run_dir(tmp_path, "sweep-layers")
    (run / "run.json").write_text(json.dumps({"command_name": "sweep-layers",
                                              "argv": "nsadiag sweep-layers"}))
    with pytest.raises(RecordError, match="^run.json: argv must be a list, got str$"):
        render_run(run)


def test_a_fault_while_rendering_parsed_records_is_not_called_a_malformed_record(
        tmp_path, monkeypatch):
    run = run_dir(tmp_path, "sweep-layers")
    append_record(run / "trials.jsonl", one_step_record(1))
    import nsadiag.report.sweep as sweep_report

    def broken(*args, **kwargs):
        raise KeyError("a renderer's own bug")
    monkeypatch.setattr(sweep_report, "build_report", broken)
    with pytest.raises(KeyError, match="a renderer's own bug"):
        render_run(run)


def test_a_stacks_json_that_does_not_parse_is_one_record_error_naming_it(tmp_path):
    run = run_dir(tmp_path, "stacks", stacks_json={"not": "stacks"})
    with pytest.raises(RecordError, match=r"^stacks.json: a stored record is malformed "
                                          r"\(KeyError: 'processes'\)$"):
        render_run(run)


def test_a_stored_trial_record_reads_as_a_typed_verdict_and_writes_back_the_same_json():
    stored = (REPO / "reports" / "sweep-layers-cuda" / "trials.jsonl").read_text()
    for line in stored.splitlines():
        record = TrialRecord.from_dict(json.loads(line))
        assert isinstance(record.verdict, Verdict) and record.verdict.name is VerdictName.OK
        assert json.dumps(record.to_dict()) == json.dumps(json.loads(line))


def test_a_stored_verdict_without_facts_has_none_and_one_of_no_known_name_is_skipped(
        tmp_path):
    data = one_step_record(1).to_dict()
    del data["verdict"]["facts"]
    assert TrialRecord.from_dict(data).facts.to_dict() == {}
    data["verdict"]["name"] = "MAYBE"
    with pytest.raises(RecordError, match=r"^not a trial record \(Verdict.name: 'MAYBE' is "
                                          r"not one of OK, "):
        TrialRecord.from_dict(data)
    trials = tmp_path / "trials.jsonl"
    trials.write_text(json.dumps(data) + "\n")
    skipped: list[str] = []
    assert load_records(trials, skipped) == []
    assert len(skipped) == 1 and "'MAYBE' is not one of" in skipped[0]
