"""The data contract: summary.json and trials.jsonl records are typed, versioned and
validated against the schemas that ship with the package; every example under reports/
conforms; load_trials gives one flat row per trial."""

import json

import pytest

import nsadiag
from nsadiag.report.summary import KINDS, Summary
from nsadiag.rundir import TrialRecord, append_record, load_records
from nsadiag.schema import SCHEMA_VERSION, errors, load_schema, schema_path, validate
from nsadiag.spec import TrialSpec
from tests.helpers import REPO, trial_record

EXAMPLES = sorted((REPO / "reports").glob("**/summary.json"))


def _record_at_depth(n_layers: int, verdict: str = "OK", trial: str = "trial-0"
                     ) -> TrialRecord:
    """A record whose step time, peak and saved bytes grow with the depth, the spec in
    its evidence as the runner writes it."""
    spec = json.loads(TrialSpec(n_layers=n_layers, seq_len=64, out_dir=trial,
                                overrides={"dim": 32}).to_json())
    result = {"step_s": [0.5, 1.0 * n_layers, 1.1 * n_layers], "forward_s": [0.2, 0.4, 0.4],
              "backward_s": [0.3, 0.6, 0.7], "steps_done": 3, "peak_rss": 1000 * n_layers,
              "saved_bytes": 100 * n_layers,
              "saved_by_branch": {"cmp": 10, "sel": 20, "win": 5}}
    return trial_record(spec, result, verdict, trial, wall_s=2.0, spec_in_evidence=True)


def test_the_schemas_ship_with_the_package_and_name_their_version():
    for name in ("summary", "trial"):
        assert schema_path(name).is_file()
        schema = load_schema(name)
        assert schema["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert set(load_schema("summary")["properties"]["command"]["enum"]) == set(KINDS)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"schemas/*.schema.json"' in pyproject


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_every_example_summary_validates(path):
    summary = json.loads(path.read_text())
    assert errors(summary, "summary") == []
    assert Summary.from_dict(summary).command == summary["command"]
    assert all(label for label in summary["fits"])  # a real label, never ""


def test_there_are_examples_of_the_main_kinds():
    kinds = {json.loads(p.read_text())["command"] for p in EXAMPLES}
    assert {"sweep-layers", "isolate-branch", "ddp", "check", "triage", "memory", "trace",
            "stacks"} <= kinds


def test_the_checker_reports_violations_and_refuses_an_invalid_schema():
    summary = Summary("sweep-layers", "all trials OK", "healthy",
                      details={"threshold": None, "stall": None}).to_dict()
    assert errors(summary, "summary") == []
    broken = {**summary, "status": "fine", "fits": {"": {}}}
    del broken["threshold"]
    found = errors(broken, "summary")
    assert any(e.startswith("at $.status: 'fine' is not one of") for e in found), found
    assert any("'threshold' is a required property" in e for e in found), found
    assert any(e.startswith("at $.fits: ''") for e in found), found
    assert validate("ab", {"pattern": "^a"}) == []
    assert validate("b", {"pattern": "^a"}) == ["at $: 'b' does not match '^a'"]
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        validate(1, {"type": "tuple"})
    with pytest.raises(ValueError, match="may not set 'status'"):
        Summary("run", "x", "healthy", details={"status": "ok"}).to_dict()


def test_a_record_carries_its_spec_once_and_reads_back_whole(tmp_path):
    record = _record_at_depth(2)
    line = record.to_dict()
    assert line["schema_version"] == SCHEMA_VERSION and "spec" not in line["evidence"]
    assert errors(line, "trial") == []
    append_record(tmp_path / "trials.jsonl", record)
    text = (tmp_path / "trials.jsonl").read_text()
    assert text.count('"n_layers"') == 1  # the spec is written once
    (back,) = load_records(tmp_path / "trials.jsonl")
    assert back.spec == record.spec and back.evidence["spec"] == record.spec
    assert back.evidence["result"] == record.evidence["result"]


def test_load_trials_is_one_flat_row_per_trial(tmp_path):
    for i, n in enumerate((1, 2, 3)):
        append_record(tmp_path / "trials.jsonl", _record_at_depth(
            n, "OK" if n < 3 else "SLOW", f"{tmp_path}/trial-{i}"))
    (tmp_path / "run.json").write_text(json.dumps({"command_name": "sweep-layers",
                                                   "labels": {"trial-2": "deep"}}))
    frame = nsadiag.load_trials(tmp_path)
    assert list(frame["trial"]) == ["trial-0", "trial-1", "trial-2"]
    assert list(frame["label"]) == ["sweep-layers", "sweep-layers", "deep"]
    assert list(frame["verdict"]) == ["OK", "OK", "SLOW"]
    assert list(frame["n_layers"]) == [1, 2, 3]
    assert list(frame["step_s"]) == pytest.approx([1.05, 2.1, 3.15])  # median of steps 1-2
    assert list(frame["saved_sel"]) == [20, 20, 20]
    assert list(frame["overrides.dim"]) == [32, 32, 32]
    assert frame.attrs["skipped"] == []
    # every column is a scalar: nothing nested, no second copy of the spec
    assert not any(isinstance(v, (dict, list)) for v in frame.to_dict("list").values()
                   for v in v)
    assert "spec" not in frame.columns and "evidence" not in frame.columns


def test_load_trials_reports_a_torn_tail_and_refuses_an_empty_directory(tmp_path):
    append_record(tmp_path / "trials.jsonl", _record_at_depth(1))
    with open(tmp_path / "trials.jsonl", "a") as f:
        f.write('{"schema_version": 1, "spec": {"n_la')
    frame = nsadiag.load_trials(tmp_path)
    assert len(frame) == 1
    assert frame.attrs["skipped"] == ["trials.jsonl line 2: torn or not JSON"]
    with pytest.raises(ValueError, match="no trials.jsonl or record.json"):
        nsadiag.load_trials(tmp_path / "empty")
