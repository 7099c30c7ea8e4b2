"""`nsadiag merge` opens records as `nsadiag report` does: never through a link, never more
than the size cap, and a malformed record (nested too deeply, ranks of the wrong type) is
one line naming the file and the field, exit 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from nsadiag import rundir
from nsadiag.cli import app
from tests.nsadiag.verdict.test_stragglers import _ended_run, _rank, job_events


def _two_runs(tmp_path):
    events = job_events({r: [0.03] * 8 for r in range(4)})
    return [_ended_run(tmp_path, "host1", [_rank(r, events[r]) for r in (0, 1)], {}),
            _ended_run(tmp_path, "host2", [_rank(r, events[r]) for r in (2, 3)], {})]


def _merge(*dirs) -> tuple[int, str]:
    done = CliRunner().invoke(app, ["merge", *map(str, dirs)])
    return done.exit_code, done.stderr


def test_two_well_formed_runs_merge(tmp_path):
    done = CliRunner().invoke(app, ["merge", *map(str, _two_runs(tmp_path))])
    assert done.stderr == "" and done.exit_code in (0, 1), done.stderr
    assert done.stdout.split(":", 1)[0] in ("OK", "ERROR", "CRASH", "STALL-COLLECTIVE",
                                            "STALL-BUSY", "DEADLOCK", "INCONCLUSIVE")


def test_a_record_that_is_a_link_out_of_its_directory_is_refused_unread(tmp_path):
    first, second = _two_runs(tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"secret": "the outside file's content"}))
    (second / "record.json").unlink()
    (second / "record.json").symlink_to(outside)
    code, err = _merge(first, second)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "record.json" in err and "link" in err and "outside file" not in err


def test_a_record_above_the_size_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    first, second = _two_runs(tmp_path)
    monkeypatch.setattr(rundir, "MAX_JSON_BYTES", 1024)
    code, err = _merge(first, second)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "record.json is larger than" in err


def test_a_record_nested_200000_deep_is_one_line(tmp_path):
    first, second = _two_runs(tmp_path)
    (second / "record.json").write_text("[" * 200_000 + "]" * 200_000)
    code, err = _merge(first, second)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "host2/record.json" in err and "nests too deeply" in err


def test_ranks_of_the_wrong_type_are_one_line_naming_the_file_and_the_field(tmp_path):
    first, second = _two_runs(tmp_path)
    record = json.loads((second / "record.json").read_text())
    record["evidence"]["ranks"] = [5, "x", None]
    (second / "record.json").write_text(json.dumps(record))
    code, err = _merge(first, second)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.endswith("host2/record.json: evidence.ranks[0] is 5, not a rank's record (an "
                        "object)\n"), err
    record["evidence"]["ranks"] = [{"rank": "zero", "names": {"host": "host2"}}]
    (second / "record.json").write_text(json.dumps(record))
    code, err = _merge(first, second)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "host2/record.json (evidence.ranks, evidence.hosts): a stored record is " \
        "malformed" in err, err
