"""The data contract: summary.json and trials.jsonl records are typed, versioned and
validated against the schemas that ship with the package; every example under reports/
conforms; load_trials gives one flat row per trial."""

import json
from pathlib import Path

import pytest

import nsadiag
from nsadiag.evidence import (
    CommandFacts,
    DdpFacts,
    Evidence,
    JobFacts,
    ProcessOutcome,
    StackFrame,
    StackSample,
    StallEvidence,
    ThreadStack,
)
from nsadiag.report.summary import KINDS, Summary
from nsadiag.rundir import RecordError, TrialRecord, append_record, load_records, write_json
from nsadiag.schema import SCHEMA_VERSION, errors, load_schema, schema_path, validate
from nsadiag.spec import TrialSpec
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.ranks import RankEvidence
from nsadiag.waitfacts import ProcessWaits, SocketEnd, ThreadWait
from tests.helpers import REPO, trial_record

EXAMPLES = sorted((REPO / "reports").glob("**/summary.json"))
COMMITTED_RECORDS = sorted((REPO / "reports").glob("**/trials.jsonl")) + sorted(
    (REPO / "reports").glob("**/record.json"))


def _record_at_depth(n_layers: int, verdict: str = "OK", trial: str = "trial-0"
                     ) -> TrialRecord:
    """A record whose step time, peak and saved bytes grow with the depth."""
    spec = json.loads(TrialSpec(n_layers=n_layers, seq_len=64, out_dir=trial,
                                overrides={"dim": 32}).to_json())
    result = {"step_s": [0.5, 1.0 * n_layers, 1.1 * n_layers], "forward_s": [0.2, 0.4, 0.4],
              "backward_s": [0.3, 0.6, 0.7], "steps_done": 3, "peak_rss": 1000 * n_layers,
              "saved_bytes": 100 * n_layers,
              "saved_by_branch": {"cmp": 10, "sel": 20, "win": 5}}
    return trial_record(spec, result, verdict, trial, wall_s=2.0)


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
    assert back.spec == record.spec and back.evidence.spec == record.spec.to_dict()
    assert back.evidence == record.evidence and back.verdict == record.verdict


def _full_record(run: Path) -> TrialRecord:
    """A record with every part of the evidence filled: a stall with a sample and the
    waits the OS reported, two ranks, the job's and DDP's shape, a command's processes,
    the hosts' view, the source,
    what became of the output, an interruption, and a key this nsadiag does not read."""
    spec = {"command": ["python", "train.py"], "stall_timeout_s": 5.0, "deadline_s": None,
            "subject": "the command"}
    frame = StackFrame("wait", "/home/u/train.py", 12, code="lock.acquire()")
    sample = StackSample(10.0, 41, [ThreadStack(1, "MainThread", [frame], os_thread_id=41,
                                                active=False)], cpu_seconds=0.5)
    waits = ProcessWaits(41, ("python", "train.py"), (ThreadWait(41, "futex_wait", 202),),
                         sockets=(SocketEnd(3, 77, "TCP", "127.0.0.1:1", "127.0.0.1:2"),))
    stall = StallEvidence(6.0, 5.0, 0.01, samples=[sample], stacks_class="waiting",
                          main_cpu_delta_s=0.0, runq_delta_s=0.0, waits=waits)
    ranks = [RankEvidence(r, 41 + r, [{"t": 1.0, "kind": "step", "step": 0}], {"step": 1},
                          None, stall=stall, names={"host": "h", "rank": r})
             for r in (0, 1)]
    evidence = Evidence(
        spec=spec, events=[{"t": 1.0, "kind": "start", "argv": ["train.py"]}],
        event_counts={"start": 1}, result={"status": "ok", "steps_done": 3},
        outcome=ProcessOutcome(None, 9, "SIGKILL", True, "stall", 6.5, ended_at=11.0),
        stall=stall, expected_events_per_step=None, total_steps=0, stall_timeout_s=5.0,
        pulses=[{"t": 2.0, "progress": 3}], load={"contended": False}, profile={"samples": 2},
        thread_exceptions=[{"thread": "loader", "type": "ValueError"}],
        others=[{"pid": 50, "role": "DataLoader worker 0", "stall": stall.to_dict()}],
        crash={"where": "train.py:12"}, ranks=[r.to_dict() for r in ranks],
        job=JobFacts("trial", None, 2),
        ddp=DdpFacts(2, "nccl", 30.0, False, [{"file": "fr-0", "unreadable": "torn"}]),
        command=CommandFacts([{"name": "main", "pid": 41, "rank": None, "events": {},
                               "role": "the training process", "place": None,
                               "stall": stall.to_dict()}], "main", None,
                             "stopped by nsadiag at a stall"),
        hosts={"host": "h", "lost": []}, source={"files": {}}, output_copies=["cut short"],
        output_not_shown={"stdout.txt": 10}, containment={"cgroup": False},
        interrupted={"signal": "SIGINT"}, unknown={"from_a_later_nsadiag": [1, 2]})
    verdict = Verdict("DEADLOCK", ["waits"], {"wait_frame": "acquire (t.py:3)"})
    return TrialRecord(spec, evidence, verdict, str(run), 6.5)


def test_a_record_with_all_its_evidence_writes_back_byte_for_byte(tmp_path):
    record = _full_record(tmp_path / "run")
    append_record(tmp_path / "trials.jsonl", record)
    written = (tmp_path / "trials.jsonl").read_bytes()
    (back,) = load_records(tmp_path / "trials.jsonl")
    assert back.evidence == record.evidence  # parsed once, into the same typed objects
    assert isinstance(back.evidence.stall.waits, ProcessWaits)
    assert back.evidence.command.ended == "stopped by nsadiag at a stall"
    append_record(tmp_path / "again.jsonl", back)
    assert (tmp_path / "again.jsonl").read_bytes() == written
    write_json(tmp_path / "record.json", record.to_dict())
    stored = (tmp_path / "record.json").read_text()
    again = TrialRecord.from_dict(json.loads(stored))
    assert json.dumps(again.to_dict(), indent=1) + "\n" == stored


def test_the_committed_records_write_back_byte_for_byte():
    for path in COMMITTED_RECORDS:
        for line in path.read_text().splitlines(keepends=True):
            record = TrialRecord.from_dict(json.loads(line))
            assert record.evidence is not None and record.evidence.job is not None
            assert json.dumps(record.to_dict()) + "\n" == line, path


def test_an_empty_evidence_is_none_and_one_without_an_outcome_is_refused(tmp_path):
    line = _record_at_depth(1).to_dict()
    bare = TrialRecord.from_dict({**line, "evidence": {}})
    assert bare.evidence is None and bare.to_dict()["evidence"] == {}
    with pytest.raises(RecordError, match="evidence: KeyError: 'outcome'"):
        TrialRecord.from_dict({**line, "evidence": {"events": []}})
    (tmp_path / "trials.jsonl").write_text(json.dumps({**line, "evidence": {"events": []}})
                                           + "\n")
    skipped: list[str] = []
    assert load_records(tmp_path / "trials.jsonl", skipped) == []
    assert skipped == ["trials.jsonl line 1: not a trial record (evidence: KeyError: "
                       "'outcome')"]


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
