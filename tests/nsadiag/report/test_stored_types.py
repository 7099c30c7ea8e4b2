"""The typed records a report is rendered from, parsed once where their files are read:
each round-trips a stored file of reports/ unchanged, and refuses a value of the wrong type
with one RecordError line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nsadiag.memoryrecord import MemoryRecord
from nsadiag.probes.gpu import GpuDevice, GpuUnavailable, gpu_json, gpu_of
from nsadiag.recordspec import RecordSpec
from nsadiag.report import dispatch
from nsadiag.rundir import RecordError, TrialRecord, parse_stored
from nsadiag.runmeta import RunMeta
from nsadiag.stacksrecord import StacksRecord
from nsadiag.traceresult import TraceResult
from tests.helpers import REPO

REPORTS = REPO / "reports"
TRIALS = REPORTS / "sweep-layers-cuda" / "trials.jsonl"
MEMORY = REPORTS / "memory-cuda" / "memory.json"


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_stored_trial_record_writes_back_the_line_it_was_read_from():
    stored = _lines(TRIALS)
    assert stored
    for data in stored:
        record = TrialRecord.from_dict(data)
        assert isinstance(record.spec, RecordSpec)
        assert record.spec.n_layers == data["spec"]["n_layers"]
        assert record.spec.branches == (tuple(data["spec"]["branches"])
                                        if data["spec"]["branches"] is not None else None)
        assert json.dumps(record.to_dict()) == json.dumps(data)


def test_a_command_spec_keeps_its_keys_and_their_order():
    data = {"command": ["python", "train.py"], "stall_timeout_s": 60, "deadline_s": None,
            "kind": "watch", "subject": "the watched block", "pid": 7, "later_field": [1]}
    spec = RecordSpec.from_dict(data)
    assert spec.command == ("python", "train.py") and spec.kind == "watch"
    assert spec.is_command and spec.target is None and spec.n_layers is None
    assert json.dumps(spec.to_dict()) == json.dumps(data)  # 60 stays 60, the unnamed key kept
    assert not RecordSpec.from_dict({"target": "nsa", "seq_len": 8}).is_command


@pytest.mark.parametrize("field, value, said", [
    ("seq_len", "256", "spec.seq_len: must be an integer, got str"),
    ("grad_ckpt", 1, "spec.grad_ckpt: must be true or false, got int"),
    ("n_layers", True, "spec.n_layers: must be an integer or null, got bool"),
    ("branches", ["sel", 2], "spec.branches: must be a list of strings or null, got list"),
])
def test_a_spec_field_of_the_wrong_type_is_one_record_error(field, value, said):
    data = _lines(TRIALS)[0]
    data["spec"][field] = value
    with pytest.raises(RecordError, match=f"^not a trial record \\({said}\\)$"):
        TrialRecord.from_dict(data)


def test_gpu_rows_and_the_unavailable_line_are_typed_and_written_back():
    rows = json.loads(MEMORY.read_text())["gpu"]
    state = gpu_of(rows)
    assert isinstance(state, tuple) and isinstance(state[0], GpuDevice)
    assert state[0].name == rows[0]["name"] and state[0].processes[0].pid == \
        rows[0]["processes"][0]["pid"]
    assert gpu_json(state) == rows
    line = "gpu: NVML not available on this machine (no driver)"
    assert gpu_of(line) == GpuUnavailable(line) and gpu_json(gpu_of(line)) == line
    assert gpu_of(None) is None and gpu_json(None) is None
    data = _lines(TRIALS)[0]
    data["gpu"] = [{**rows[0], "mem_used": "3 GB"}]
    with pytest.raises(RecordError, match=r"^not a trial record \(gpu: TypeError: gpu.mem_used"):
        TrialRecord.from_dict(data)


def test_memory_json_round_trips_and_refuses_a_wrong_type():
    stored = json.loads(MEMORY.read_text())
    measured = MemoryRecord.from_dict(stored)
    assert measured.device == "cuda" and measured.per_layer[0].layer == "blocks.0"
    assert measured.largest_saved[0].shape == tuple(stored["largest_saved"][0]["shape"])
    assert json.dumps(measured.to_dict()) == json.dumps(stored)
    with pytest.raises(RecordError, match="^memory.json: a stored record is malformed "
                                          r"\(TypeError: memory.json: saved_total is a str\)$"):
        parse_stored("memory.json", MemoryRecord.from_dict, {**stored, "saved_total": "1 GB"})
    without = {k: v for k, v in stored.items() if k != "peak_rss"}
    with pytest.raises(RecordError, match=r"^memory.json: .*\(KeyError: 'peak_rss'\)$"):
        parse_stored("memory.json", MemoryRecord.from_dict, without)


def test_trace_result_round_trips_the_fields_a_report_kept():
    summary = json.loads((REPORTS / "trace" / "summary.json").read_text())
    stored = {f.name: summary[f.name] for f in dataclasses.fields(TraceResult)}
    result = TraceResult.from_dict(stored)
    assert result.step_s_untraced == stored["step_s_untraced"]
    assert result.timeline[0]["module"] == stored["timeline"][0]["module"]
    assert json.dumps(result.to_dict()) == json.dumps(stored)
    with pytest.raises(RecordError, match=r"\(TypeError: trace-result.json: events is a str\)"):
        parse_stored("trace-result.json", TraceResult.from_dict, {**stored, "events": "91"})


def test_stacks_json_is_parsed_with_its_samples():
    sample = {"t": 1.0, "pid": 11, "threads": [], "cpu_seconds": None, "native": False,
              "note": "py-spy fell back"}
    process = {"pid": 11, "rank": None, "cmdline": "python train.py", "state": "idle",
               "cpu_fraction": 0.0, "signature": "", "unavailable": [], "samples": [sample]}
    stored = {"processes": [process], "clusters": [{"signature": "", "members": [11]}],
              "odd_ones_out": []}
    stacks = StacksRecord.from_dict(stored)
    assert stacks.processes[0].samples[0].note == "py-spy fell back"
    assert stacks.clusters[0]["members"] == [11]
    with pytest.raises(RecordError, match=r"\(TypeError: stacks.json: a process's pid is a str\)"):
        parse_stored("stacks.json", StacksRecord.from_dict,
                     {**stored, "processes": [{**process, "pid": "11"}]})


def test_run_json_is_parsed_once_with_its_labels_env_and_spec():
    stored = json.loads((REPORTS / "sweep-layers-cuda" / "run.json").read_text())
    meta = RunMeta.from_dict(stored)
    assert meta.command_name == stored["command_name"] and list(meta.argv) == stored["argv"]
    assert dict(meta.labels) == stored["labels"] and meta.env.as_dict() == stored["env"]
    assert meta.label_of("trial-99") == stored["command_name"]
    spec = _lines(TRIALS)[0]["spec"]
    assert RunMeta.from_dict({"spec": spec}).spec == RecordSpec.from_dict(spec)
    with pytest.raises(RecordError, match="^run.json: labels must name each trial by a string$"):
        RunMeta.from_dict({**stored, "labels": {"trial-0": 3}})
    with pytest.raises(RecordError, match="^run.json: an attach run names its pid and"):
        RunMeta.from_dict({"command_name": "attach"}).attached()


def test_a_fault_while_rendering_a_parsed_record_is_not_called_a_malformed_file(
        tmp_path, monkeypatch):
    run = tmp_path / "memory-run"
    run.mkdir()
    (run / "memory.json").write_text(MEMORY.read_text())
    (run / "run.json").write_text(json.dumps({"command_name": "memory", "argv": ["x"]}))

    def broken(*_args):
        raise KeyError("a renderer's own fault")

    import nsadiag.report.memory

    monkeypatch.setattr(nsadiag.report.memory, "build_memory_report", broken)
    with pytest.raises(KeyError, match="a renderer's own fault"):
        dispatch.render_run(run)
    (run / "memory.json").write_text(json.dumps({**json.loads(MEMORY.read_text()),
                                                 "cuda": None}))
    with pytest.raises(RecordError, match=r"^memory.json: a stored record is malformed"):
        dispatch.render_run(run)


def test_an_optional_field_of_the_wrong_type_is_refused_where_the_file_is_read():
    from nsadiag.finding.attach import AttachRecord
    from nsadiag.stored import optional

    assert optional({"rank": None}, "rank", int) is None and optional({}, "rank", int) is None
    assert optional({"share": 1}, "share", (int, float)) == 1
    with pytest.raises(TypeError, match="^share: must be int or float, got bool$"):
        optional({"share": True}, "share", (int, float))
    process = {"pid": 4, "state": "idle", "rank": "3"}
    stored = {"verdict": {"name": "OK", "reasons": ["r"]}, "state": "idle",
              "processes": [process]}
    with pytest.raises(RecordError, match=r"^attach.json: .*\(TypeError: rank: must be int, "
                                          r"got str\)$"):
        parse_stored("attach.json", AttachRecord.from_dict, stored)
    assert AttachRecord.from_dict({**stored, "processes": [{**process, "rank": 3}]}
                                  ).processes[0].rank == 3


def test_the_commands_of_a_finding_are_built_from_the_typed_spec():
    from nsadiag.finding.commands import check_command, reproduce, trial_options

    spec = TrialRecord.from_dict(_lines(TRIALS)[0]).spec
    command = reproduce(spec)
    assert command[:2] == ["nsadiag", "sweep-layers"]
    assert command[command.index("--layers") + 1] == str(spec.n_layers)
    assert command[command.index("--stall-timeout") + 1] == f"{spec.stall_timeout_s:g}"
    alone = dataclasses.replace(spec, branches=("sel",))
    assert reproduce(alone)[:3] == ["nsadiag", "isolate-branch", "sel"]
    ddp = check_command("ddp", spec, 2, 4)
    assert ddp[:4] == ["nsadiag", "check", "ddp", "--target"]
    assert ddp[ddp.index("--world-size") + 1] == "4" and ddp[ddp.index("--layers") + 1] == "2"
    user_command = RecordSpec.from_dict({"command": ["python", "train.py"],
                                         "stall_timeout_s": 60.0, "deadline_s": 20.0})
    with pytest.raises(ValueError, match="^spec: not a trial's spec"):
        trial_options(user_command)
