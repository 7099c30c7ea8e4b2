"""A run directory received from someone else is untrusted input. Planted the way an
attacker would plant them (symbolic links to files in a temporary "home", hard links, a
FIFO, a key renamed to a plot, JSON nested past any parser, a record from a "newer"
nsadiag, a trials.jsonl of a gigabyte), nothing makes `nsadiag report` or `--bundle` write
outside the directory, copy a file nsadiag did not write into the archive, hang, run out
of memory or exit with a traceback. Nothing outside tmp_path is ever touched."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tarfile
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from nsadiag import rundir
from nsadiag.recordspec import RecordSpec
from nsadiag.report import dispatch
from nsadiag.report.bundle import bundle_path, clean_png
from nsadiag.rundir import append_record, load_records
from tests.helpers import REPO, evidence_of, nsadiag, one_step_record

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-planted-key\n"


def _sweep_dir(path: Path, trials: int = 2) -> Path:
    path.mkdir()
    for n in range(1, trials + 1):
        append_record(path / "trials.jsonl", one_step_record(n, f"trial-{n}"))
    (path / "run.json").write_text(json.dumps({"command_name": "sweep-layers"}))
    return path


def _png(extra_chunks: list[tuple[bytes, bytes]] = (), after_end: bytes = b"") -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + \
            struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)  # 1x1, 8-bit grey
    pixels = zlib.compress(b"\x00\x80")
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) +
            b"".join(chunk(k, b) for k, b in extra_chunks) + chunk(b"IDAT", pixels) +
            chunk(b"IEND", b"") + after_end)


@pytest.fixture
def home(tmp_path):
    """A stand-in for a victim's home directory: files an attacker would aim at."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    files = {".bashrc": "export PATH=$HOME/bin:$PATH\n", ".profile": "umask 022\n",
             ".ssh/id_ed25519": KEY, "credentials": "aws_secret_access_key=AKIAplanted\n",
             "passwd": "root:x:0:0:root:/root:/bin/bash\n", "notes": "my notes\n",
             "bundle-target": "keep me\n", "lock-target": "keep me too\n"}
    for name, text in files.items():
        (home / name).write_text(text)
    return home


def _snapshot(home: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(home)): (p.read_text(), p.stat().st_mtime_ns)
            for p in sorted(home.rglob("*")) if p.is_file()}


def test_report_and_bundle_never_write_through_a_planted_link(tmp_path, home):
    run = _sweep_dir(tmp_path / "received")
    before = _snapshot(home)
    bundle = bundle_path(run)
    plants = {".report.md.tmp": ".bashrc", ".summary.json.tmp": ".profile",
              ".sweep.png.tmp": "notes", ".nsadiag.lock": "lock-target",
              f".{bundle.name}.tmp": "bundle-target", bundle.name: "passwd",
              "report.md": "credentials"}
    for name, target in plants.items():
        (run / name).symlink_to(home / target)
    done = nsadiag("report", str(run), "--bundle")
    assert done.returncode == 0, done.stderr
    assert _snapshot(home) == before, "a file outside the run directory was written"
    for name in ("report.md", bundle.name, ".nsadiag.lock"):
        assert not (run / name).is_symlink() and (run / name).is_file(), name
    assert "# " in (run / "report.md").read_text()
    with tarfile.open(bundle) as tar:
        assert any(n.endswith("/report.md") for n in tar.getnames())


def test_resuming_in_a_received_directory_writes_through_no_planted_link(tmp_path, home):
    run = tmp_path / "received"
    run.mkdir()
    (run / ".nsadiag-run").write_text("a received run directory, with its marker\n")
    before = _snapshot(home)
    for name, target in {".nsadiag.lock": "lock-target", ".write-test": "notes",
                         "spec.json": ".bashrc", "trials.jsonl": ".profile",
                         ".run.json.tmp": "passwd"}.items():
        (run / name).symlink_to(home / target)
    rundir.prepare_run_dir(run)
    try:
        rundir.write_json(run / "run.json", {"command_name": "sweep-layers"})
        rundir.write_text(run / "spec.json", "{}")
        with pytest.raises(ValueError, match="trials.jsonl"):
            append_record(run / "trials.jsonl", one_step_record(1))
        os.link(home / "credentials", run / "hard.jsonl")
        with pytest.raises(ValueError, match="not a file nsadiag wrote"):
            append_record(run / "hard.jsonl", one_step_record(1))
    finally:
        rundir.release_run_dir(run)
    assert _snapshot(home) == before
    assert not (run / ".nsadiag.lock").is_symlink() and not (run / "spec.json").is_symlink()


def test_the_bundle_holds_only_regular_files_nsadiag_wrote_inside_the_directory(
        tmp_path, home):
    run = _sweep_dir(tmp_path / "received")
    trial = run / "trial-1"
    trial.mkdir()
    (trial / "events.jsonl").write_text('{"kind": "start"}\n')
    (run / "notes.txt").symlink_to(home / "passwd")  # foreign name, and a link
    (run / "env.log").symlink_to(home / "credentials")
    (trial / "stdout.txt").symlink_to(home / ".ssh" / "id_ed25519")  # our name, a link
    os.link(home / "credentials", trial / "stderr.txt")  # our name, a hard link
    (run / "plot.png").write_text(KEY)  # a key renamed to a plot nsadiag never draws
    (trial / "sweep.png").write_text(KEY)  # one of our plot names, but no PNG
    secret_png = _png([(b"tEXt", b"Comment\x00" + KEY.encode())], after_end=KEY.encode())
    (run / "memory.png").write_bytes(secret_png)  # a real PNG carrying the key
    (run / "trial-7").symlink_to(home, target_is_directory=True)
    (run / "extra").mkdir()
    (run / "extra" / "dump.json").write_text('{"n": 1}')
    os.mkfifo(trial / "result.json")  # would block a reader that opens it plainly

    done = nsadiag("report", str(run), "--bundle")
    assert done.returncode == 0, done.stderr
    with tarfile.open(bundle_path(run)) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar
                   if m.isfile()}
    for data in members.values():
        for planted in (b"planted-key", b"AKIAplanted", b"root:x:0:0", b"BEGIN OPENSSH"):
            assert planted not in data
    assert {"report.md", "summary.json", "trials.jsonl", "trial-1/events.jsonl",
            "BUNDLE.txt"} <= set(members)
    for name in ("notes.txt", "env.log", "plot.png", "trial-1/stdout.txt",
                 "trial-1/stderr.txt", "trial-1/sweep.png", "trial-1/result.json",
                 "extra/dump.json"):
        assert name not in members, name
    assert members["memory.png"] == _png()  # the image kept, its text and tail dropped
    left_out = members["BUNDLE.txt"].decode()
    for line in ("notes.txt: a symbolic link, not followed", "env.log: a symbolic link",
                 "plot.png: not written by nsadiag",
                 "trial-1/stdout.txt: a symbolic link, not followed",
                 "trial-1/stderr.txt: a hard link", "trial-1/sweep.png: not a well-formed PNG",
                 "trial-1/result.json: not a regular file", "trial-7: a symbolic link",
                 "extra/: a directory nsadiag did not make"):
        assert line in left_out, (line, left_out)
    assert "redaction.json" not in members


def test_a_png_is_copied_only_as_its_image_chunks():
    image = _png()
    assert clean_png(image) == image
    assert clean_png(_png([(b"tEXt", b"k\x00secret")], after_end=b"secret")) == image
    assert clean_png(KEY.encode()) is None
    broken = bytearray(image)
    broken[-5] ^= 0xFF  # IEND's CRC
    assert clean_png(bytes(broken)) is None
    assert clean_png(image[:-12]) is None  # no IEND


def test_a_planted_link_in_place_of_a_stored_record_is_refused_not_read(tmp_path, home):
    run = tmp_path / "received"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": "run"}))
    (run / "record.json").symlink_to(home / "credentials")
    done = nsadiag("report", str(run))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "record.json" in done.stderr and "symbolic link" in done.stderr
    assert "AKIAplanted" not in done.stderr + done.stdout


def test_stderr_linked_outside_never_reaches_the_report(tmp_path, home):
    run = tmp_path / "received"
    run.mkdir()
    record = one_step_record()
    record.spec = RecordSpec.from_dict({"command": ["python", "train.py"],
                                        "stall_timeout_s": 60.0, "deadline_s": 60.0,
                                        "subject": "the command"})
    record.evidence = evidence_of(record.spec, {**record.evidence.to_dict(), "exit_code": 0,
                                                "processes": []})
    (run / "record.json").write_text(json.dumps(record.to_dict()))
    (run / "run.json").write_text(json.dumps({"command_name": "run"}))
    (run / "stderr.txt").symlink_to(home / ".ssh" / "id_ed25519")
    done = nsadiag("report", str(run), "--no-redact")
    assert done.returncode == 0, done.stderr
    assert "planted-key" not in (run / "report.md").read_text()


def test_report_waits_for_the_directory_lock_and_names_its_holder(tmp_path, monkeypatch):
    run = _sweep_dir(tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from nsadiag.rundir import lock_run_dir; lock_run_dir(Path(sys.argv[1])); "
         "print('held', flush=True); time.sleep(120)", str(run)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(dispatch, "LOCK_WAIT_S", 0.3, raising=False)
        with pytest.raises(ValueError, match=rf"in use by another nsadiag \(pid {holder.pid}\)"):
            getattr(dispatch, "render_locked", dispatch.render_run)(run)
        assert not (run / "report.md").exists()
    finally:
        holder.kill()
        holder.wait()
    assert dispatch.render_locked(run).report.exists()  # the dead holder's lock is gone


def test_concurrent_bundles_both_succeed(tmp_path):
    run = _sweep_dir(tmp_path / "run")
    procs = [subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "report", str(run),
                               "--bundle"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    with tarfile.open(bundle_path(run)) as tar:
        assert any(n.endswith("/BUNDLE.txt") for n in tar.getnames())
    assert not list(run.glob(".*.tmp"))


def test_a_record_of_a_newer_schema_is_refused_in_one_line(tmp_path):
    path = tmp_path / "trials.jsonl"
    append_record(path, one_step_record(1))
    newer = one_step_record(2).to_dict()
    newer["schema_version"] = 999
    with open(path, "a") as f:
        f.write(json.dumps(newer) + "\n")
    skipped: list[str] = []
    assert [r.spec.n_layers for r in load_records(path, skipped)] == [1]
    assert skipped == ["trials.jsonl line 2: trial record: schema_version 999 is not one this "
                       "nsadiag reads (1 to 1): written by a newer nsadiag, or not by nsadiag"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"schema_version": 999,
                                              "command_name": "sweep-layers"}))
    append_record(run / "trials.jsonl", one_step_record(1))
    done = nsadiag("report", str(run))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "run.json: schema_version 999 is not one this nsadiag reads" in done.stderr


def test_deeply_nested_json_is_one_line_not_an_internal_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": "run"}))
    (run / "record.json").write_text("[" * 200_000 + "]" * 200_000)
    done = nsadiag("report", str(run))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("nsadiag: error: record.json: ") and \
        "nests too deeply" in done.stderr and len(done.stderr.splitlines()) == 1
    path = tmp_path / "trials.jsonl"
    append_record(path, one_step_record(1))
    with open(path, "a") as f:
        f.write("[" * 200_000 + "]" * 200_000 + "\n")
    skipped: list[str] = []
    assert len(load_records(path, skipped)) == 1
    assert skipped == ["trials.jsonl line 2: nested too deeply to read"]


def test_trials_jsonl_is_read_line_by_line_in_bounded_memory(tmp_path, monkeypatch):
    path = tmp_path / "trials.jsonl"
    append_record(path, one_step_record(1, "trial-1"))
    with open(path, "ab") as f:
        f.write(b'{"spec": "' + b"x" * (40 * 2**20) + b'"}\n')  # 40 MiB on one line
    append_record(path, one_step_record(2, "trial-2"))
    skipped: list[str] = []
    monkeypatch.setattr(rundir, "MAX_RECORD_BYTES", 2**20, raising=False)  # 16 MiB in use
    tracemalloc.start()
    try:
        records = load_records(path, skipped)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r.spec.n_layers for r in records] == [1, 2]
    assert skipped == ["trials.jsonl line 2: longer than 1 MiB, not read"]
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.0f} MiB for a 40 MiB line"
    # many records: only the first MAX_RECORDS_BYTES are kept, the rest named
    line = len(json.dumps(one_step_record(1).to_dict())) + 1
    monkeypatch.setattr(rundir, "MAX_RECORDS_BYTES", 3 * line + 10)
    many = tmp_path / "many.jsonl"
    for n in range(1, 11):
        append_record(many, one_step_record(n, f"trial-{n}"))
    skipped = []
    assert len(load_records(many, skipped)) == 3
    assert skipped == [f"many.jsonl line 4 and later: past the first "
                       f"{rundir.MAX_RECORDS_BYTES // 2**20} MiB of records, not read"]


PEAK_OF_REPORT = """
import atexit, sys
def peak():
    with open("/proc/self/status") as status:
        sys.stderr.write(next(line for line in status if line.startswith("VmHWM:")))
atexit.register(peak)
sys.argv = ["nsadiag", "report", sys.argv[1]]
from nsadiag.cli import main
main()
"""


def test_report_on_a_gigabyte_trials_jsonl_stays_in_bounded_memory(tmp_path):
    run = _sweep_dir(tmp_path / "run", trials=1)
    with open(run / "trials.jsonl", "ab") as f:  # a sparse GiB of NUL bytes, one line
        f.truncate(f.seek(0, os.SEEK_END) + 2**30)
        f.seek(0, os.SEEK_END)
        f.write(b"\n")
    append_record(run / "trials.jsonl", one_step_record(2, "trial-2"))
    started = time.monotonic()
    # the peak of this process's own memory (VmHWM): a child's ru_maxrss also counts the
    # parent's resident set at the fork, and pytest's is large
    done = subprocess.run([sys.executable, "-c", PEAK_OF_REPORT, str(run)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = (run / "report.md").read_text()
    assert "trials.jsonl line 2: longer than 16 MiB, not read" in report
    peak_mib = int(done.stderr.split("VmHWM:")[1].split()[0]) / 1024
    print(f"report over a 1 GiB trials.jsonl: peak RSS {peak_mib:.0f} MiB, "
          f"{time.monotonic() - started:.1f} s")
    assert peak_mib < 400, f"peak RSS {peak_mib:.0f} MiB"


def test_compare_refuses_a_nested_or_newer_summary_in_one_line(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"schema_version": 1, "rows": []}))
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 200_000 + "]" * 200_000)
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"schema_version": 999, "rows": []}))
    for bad, says in ((nested, "nests too deeply"), (newer, "schema_version 999")):
        done = nsadiag("compare", str(bad), str(good))
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert says in done.stderr
