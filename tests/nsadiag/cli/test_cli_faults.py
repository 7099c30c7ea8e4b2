"""No residue, no tracebacks: a refused command leaves nothing behind; a full disk, a
closed stdout and a malformed record are one line and a non-zero exit; trials.jsonl never
keeps a torn record."""

import errno
import json
import os
import resource
import signal
import subprocess
import sys

import pytest
import torch

from nsadiag.rundir import append_record, load_records
from tests.helpers import REPO, nsadiag, one_step_record
from tests.procs import wait_for


@pytest.mark.parametrize("args", [
    ["ddp", "--pg-timeout", "-1"], ["ddp", "--pg-timeout", "nan"],
    ["ddp", "--world-size", "0"], ["sweep-layers", "--layers", "3-1"],
    ["triage", "--max-minutes", "0"], ["check", "causality", "--target", "no.such:make"],
    ["run"], ["run", "--", "no-such-program-anywhere"], ["stacks", "999999999"],
    ["trace", "--set", "n_heads=3"],
    pytest.param(["memory", "--device", "cuda"], marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="checks the refusal without CUDA")),
])
def test_a_refused_command_leaves_nothing_behind(args, tmp_path):
    out = tmp_path / "run"
    done = nsadiag(*args, "--out", str(out)) if args[0] != "run" else \
        nsadiag("run", "--out", str(out), *args[1:])
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("nsadiag: error: ")
    assert not out.exists()


def test_a_full_disk_is_one_line_and_leaves_no_half_written_report(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for n in (1, 2, 3):
        append_record(run / "trials.jsonl", one_step_record(n, f"trial-{n}"))
    (run / "run.json").write_text(json.dumps({"command_name": "sweep-layers"}))

    def small_files():  # writes past 2 KiB fail with EFBIG, as a full disk fails them
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    # matplotlib builds its font cache on a machine's first import and, when it cannot save
    # it, says so on stderr: build it first, so the machine's history cannot matter
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=True,
                   capture_output=True, timeout=120, cwd=REPO)

    done = nsadiag("report", str(run), preexec_fn=small_files)
    assert done.returncode == 2
    assert done.stderr.startswith("nsadiag: error: out: cannot write ") and \
        len(done.stderr.splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert not (run / "report.md").exists()
    assert not list(run.glob(".*.tmp"))


def test_a_failed_append_leaves_no_torn_record(tmp_path, monkeypatch):
    path = tmp_path / "trials.jsonl"
    append_record(path, one_step_record(1))
    before = path.read_bytes()
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(ValueError, match="out: cannot write .*No space left on device"):
        append_record(path, one_step_record(2))
    monkeypatch.undo()
    assert path.read_bytes() == before  # cut back: the half line is gone
    append_record(path, one_step_record(3))
    assert [r.spec.n_layers for r in load_records(path)] == [1, 3]


def test_a_torn_or_malformed_line_is_skipped_and_reported(tmp_path):
    path = tmp_path / "trials.jsonl"
    append_record(path, one_step_record(1))
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "spec": {}, "evidence": {}}\n')  # no verdict
        f.write('{"spec": {"n_la')  # torn by a killed writer
    skipped: list[str] = []
    assert len(load_records(path, skipped)) == 1
    assert skipped[0] == ("trials.jsonl line 2: not a trial record (at $: 'verdict' is a "
                          "required property)"), skipped
    assert skipped[1] == "trials.jsonl line 3: torn or not JSON"


def test_report_on_a_malformed_record_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": "run"}))
    (run / "record.json").write_text(json.dumps({"spec": {"command": ["x"]}}))
    done = nsadiag("report", str(run))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("nsadiag: error: not a trial record") or \
        "malformed" in done.stderr
    (run / "run.json").write_text("{not json")
    done = nsadiag("report", str(run))
    assert done.returncode == 2 and "run.json:" in done.stderr and \
        len(done.stderr.splitlines()) == 1


def test_a_report_shows_a_torn_tail(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for n in (1, 2):
        append_record(run / "trials.jsonl", one_step_record(n, f"trial-{n}"))
    with open(run / "trials.jsonl", "a") as f:
        f.write('{"spec": {"n_la')
    done = nsadiag("report", str(run))
    assert done.returncode == 0, done.stderr
    assert "trials.jsonl line 3: torn or not JSON" in (run / "report.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["skipped_records"] == ["trials.jsonl line 3: torn or not JSON"]


def test_a_closed_stdout_is_one_line_and_a_non_zero_exit(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    append_record(run / "trials.jsonl", one_step_record(1))
    read, write = os.pipe()
    os.close(read)  # like `| head -n 1` that has already gone
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "report", str(run)],
                            stdout=write, stderr=subprocess.PIPE, text=True, cwd=REPO)
    os.close(write)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert stderr == ("nsadiag: error: stdout was closed before everything was printed "
                      "(the run's files are written)\n")
    assert (run / "report.md").exists()


def test_sigterm_to_a_run_keeps_what_it_found_and_exits_143(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", "--out",
                             str(tmp_path / "r"), "--", sys.executable, "-c",
                             "import time; time.sleep(60)"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    wait_for(lambda: list((tmp_path / "r").glob("proc-*/events.jsonl")), 120,
             "the command's heartbeat")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert "Traceback" not in stderr and "nsadiag: interrupted by SIGTERM" in stderr
    record = json.loads((tmp_path / "r" / "record.json").read_text())
    assert record["evidence"]["interrupted"]["signal"] == "SIGTERM"
    assert "interrupted by SIGTERM" in (tmp_path / "r" / "report.md").read_text()
