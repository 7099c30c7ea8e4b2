"""A received run directory is rendered without reading the receiver's files and without
obeying what its records hold.

Paths in a record are data: records planted with ``where`` and traceback frames naming
/etc/shadow, a key in the receiver's home, /proc/self/environ, /dev/stdin and /dev/zero
render (within a process timeout, not a timed assertion) with none of those files' content
in report.md, summary.json or the bundle; a trial_dir of "/" is ignored with a line saying
so; a gigabyte profile.json is not read, a linked one not followed, a FIFO dump not opened.
The code of a culprit line comes from what the record stored when it was made.

Text is shown, never obeyed: an exception message, a command word and a quoted stderr
line holding cursor-up + erase-line, OSC 52 (clipboard) and OSC 0 (title) reach neither
`nsadiag report`'s stdout (in a pipe and in a pseudo-terminal) nor report.md or
summary.json. Nothing outside tmp_path is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from nsadiag import runfiles
from nsadiag.finding.culprit import culprit_of
from nsadiag.finding.source import capture, carried_sources
from nsadiag.report.bundle import bundle_path
from nsadiag.rundir import TrialRecord, append_record
from nsadiag.spec import TrialSpec
from nsadiag.textsafe import clean, clean_line
from tests.helpers import REPO, REPRO, evidence_of, nsadiag, trial_record
from tests.pty_cli import in_pty

KEY_LINE = "b3BlbnNzaC1rZXktdjEAAAAA-planted-receiver-key"
ENV_MARKER = "planted-receiver-environ-4711"
RENDER_TIMEOUT_S = 240
"""The bound on rendering every planted directory of a test: a process timeout (a render
that blocks on /dev/stdin or streams /dev/zero never returns at all)."""

CURSOR = "\x1b[1A\x1b[2K OK (healthy)"
CLIPBOARD = "\x1b]52;c;cGxhbnRlZC1jbGlwYm9hcmQ=\x07"
TITLE = "\x1b]0;planted-title\x1b\\"
HOSTILE_TEXT = f"boom{CURSOR}{CLIPBOARD}{TITLE}\x9b2J\x07\r\x7f end"


@pytest.fixture
def home(tmp_path):
    """A stand-in for the receiver's home: a private key whose line 2 is the secret."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_LINE}\n-----END OPENSSH PRIVATE KEY-----\n")
    return home


def _run_record(trial_dir: str, verdict: str, facts: dict, **evidence) -> TrialRecord:
    record = trial_record({"command": ["python", "train.py"], "stall_timeout_s": 60.0,
                           "deadline_s": 60.0, "subject": "the command"}, None, verdict,
                          trial_dir, facts=facts)
    record.evidence = evidence_of(record.spec, {**record.evidence.to_dict(), "exit_code": 1,
                                                "processes": [], **evidence})
    return record


def _plant_run(path: Path, record: TrialRecord) -> Path:
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"command_name": "run"}))
    (path / "record.json").write_text(json.dumps(record.to_dict()))
    return path


def _error_naming(file: str, line: int) -> TrialRecord:
    traceback = (f'Traceback (most recent call last):\n  File "{file}", line {line}, in f\n'
                 f"RuntimeError: boom\n")
    return _run_record("/", "ERROR", {"exception_type": "RuntimeError", "message": "boom",
                                      "where": f"{file}:{line} in f"},
                       result={"status": "error", "exception": {
                           "type": "RuntimeError", "message": "boom",
                           "traceback": traceback}})


def _busy_in(places: list[tuple[str, int]]) -> TrialRecord:
    """A STALL-BUSY record whose samples' running frames sit in ``places`` (each file's
    loops and lines were looked up)."""
    samples = [{"t": float(i), "pid": 7, "threads": [
        {"thread_id": 1, "name": "MainThread", "active": True,
         "frames": [{"function": "f", "file": file, "line": line}]}]}
        for i, (file, line) in enumerate(places)]
    return _run_record("/", "STALL-BUSY", {"stacks_class": "busy-python"},
                       stall={"since_last_event_s": 5.0, "samples": samples,
                              "stacks_class": "busy-python"})


RENDER_ALL = """
import sys
from pathlib import Path
from nsadiag.report.bundle import write_bundle
from nsadiag.report.dispatch import render_locked
for name in sys.argv[1:]:
    render_locked(Path(name))
    write_bundle(Path(name))
"""


def _render_all(dirs: list[Path], home: Path) -> None:
    """`nsadiag report DIR --bundle` of every directory in one process whose stdin is a
    pipe nobody writes (a read of /dev/stdin would block), HOME the planted home and
    ENV_MARKER in its environment; the process timeout is the bound."""
    quiet, hold = os.pipe()
    env = {**os.environ, "HOME": str(home), "PLANTED_MARKER": ENV_MARKER}
    try:
        done = subprocess.run([sys.executable, "-c", RENDER_ALL, *map(str, dirs)], cwd=REPO,
                              stdin=quiet, capture_output=True, text=True, env=env,
                              timeout=RENDER_TIMEOUT_S)
    finally:
        os.close(quiet)
        os.close(hold)
    assert done.returncode == 0, done.stderr[-2000:]


def _shared_text(run: Path) -> str:
    """report.md, summary.json and every member of the bundle, as one text."""
    parts = [(run / "report.md").read_text(), (run / "summary.json").read_text()]
    with tarfile.open(bundle_path(run)) as tar:
        parts += [tar.extractfile(m).read().decode(errors="replace") for m in tar if m.isfile()]
    return "\n".join(parts)


def _first_line(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.readline().strip() or None
    except OSError:
        return None


def test_a_record_naming_the_receivers_files_renders_none_of_them(tmp_path, home):
    named = {"shadow": ("/etc/shadow", 1), "key": (str(home / ".ssh" / "id_rsa"), 2),
             "environ": ("/proc/self/environ", 1), "stdin": ("/dev/stdin", 1),
             "zero": ("/dev/zero", 1), "passwd": ("/etc/passwd", 1)}
    dirs = {name: _plant_run(tmp_path / name, _error_naming(*where))
            for name, where in named.items()}
    dirs["frames"] = _plant_run(tmp_path / "frames", _busy_in(list(named.values())))
    _render_all(list(dirs.values()), home)
    shadow, passwd = _first_line("/etc/shadow"), _first_line("/etc/passwd")
    for name, run in dirs.items():
        shared = _shared_text(run)
        leaked = [what for what, text in (("the key", KEY_LINE), ("the environment",
                                                                  ENV_MARKER),
                                          ("/etc/shadow", shadow), ("/etc/passwd", passwd))
                  if text and text in shared]
        assert not leaked, f"{name}: the receiver's {leaked} reached what is shared"
        assert "\x00" * 8 not in shared  # nothing of /dev/zero
        summary = json.loads((run / "summary.json").read_text())
        culprit = summary["finding"]["culprit"]
        if name in named:
            assert culprit["where"] == f"{Path(named[name][0]).name}:{named[name][1]}"
        assert culprit["code"] is None
        assert "record.json names its directory '/': read as this directory" in \
            summary["files_not_read"]


def test_trial_files_outside_too_large_linked_or_a_fifo_are_not_read(tmp_path, home):
    crash = {"signal": 11, "signal_name": "SIGSEGV", "wall_s": 1.0}
    # a sweep whose crashing trial names "/" (its faulthandler dumps were globbed from /)
    root = tmp_path / "root"
    root.mkdir()
    (root / "run.json").write_text(json.dumps({"command_name": "sweep-layers"}))
    spec = json.loads(TrialSpec(n_layers=1, out_dir="/").to_json())
    append_record(root / "trials.jsonl", trial_record(spec, None, "CRASH", "/", facts=crash))
    # a run killed by SIGSEGV whose dump is a FIFO, and profiles of a gigabyte and a link
    fifo = _plant_run(tmp_path / "fifo", _run_record(str(tmp_path / "fifo"), "CRASH", crash))
    (fifo / "proc-1").mkdir()
    os.mkfifo(fifo / "proc-1" / "faulthandler.txt")
    slow = {"slow_by": None, "rate": 5.0}
    loops = {"loops": [{"where": "forward (id_rsa:2)", "variable": "t", "advanced": 90,
                        "by_one": True}],
             "hot_lines": [{"where": "forward (id_rsa:2)", "phase": "forward"}]}
    big = _plant_run(tmp_path / "big", _run_record(str(tmp_path / "big"), "SLOW", slow,
                                                   profile=loops, main_process="proc-1"))
    (big / "proc-1").mkdir()
    with open(big / "proc-1" / "profile.json", "wb") as f:
        f.truncate(2**30)  # sparse: a gigabyte to read, nothing on disk
    linked = _plant_run(tmp_path / "linked", _run_record(str(tmp_path / "linked"), "SLOW",
                                                         slow, profile=loops))
    (home / "profile.json").write_text(json.dumps(
        {"loops": [{"file": str(home / ".ssh" / "id_rsa"), "function": "forward"}]}))
    (linked / "profile.json").symlink_to(home / "profile.json")
    _render_all([root, fifo, big, linked], home)

    def not_read(run: Path) -> list[str]:
        return json.loads((run / "summary.json").read_text()).get("files_not_read") or []

    assert "trial_dir '/': outside the run directory, ignored" in not_read(root)
    assert "## Files not read" in (root / "report.md").read_text()
    assert any("profile.json" in line and "1024 MiB, larger than 64 MiB, not read" in line
               for line in not_read(big)), not_read(big)
    assert any("is a symbolic link" in line for line in not_read(linked)), not_read(linked)
    for run in (root, fifo, big, linked):
        assert KEY_LINE not in _shared_text(run)


def test_the_culprits_code_comes_from_what_the_record_stored(tmp_path):
    """Captured where the record is made, shown wherever it is rendered: the receiver's
    checkout is never read, even when a file of the same path exists there."""
    loop_file = str(REPRO / "per_token_loop.py")
    hot = {"where": "forward (per_token_loop.py:28)", "file": loop_file, "line": 28,
           "code": None, "count": 20, "fraction": 0.2, "phase": "forward"}
    record = _run_record(str(tmp_path), "SLOW", {"slow_by": "defect"},
                         profile={"hot_lines": [hot], "loops": [], "frames": []})
    record.evidence.source = capture(record.evidence.to_dict())
    stored = record.evidence.source["files"][loop_file]
    assert stored["shown"] == "repro/per_token_loop.py" and [26, 30, ["t"]] in stored["loops"]
    # the line, its loop's header and the one line of the loop's body a finding reads
    # (an append: what a memory finding looks for); no other neighbour
    assert sorted(stored["lines"]) == ["26", "28", "30"]
    moved = TrialRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    culprit = culprit_of(moved)
    assert culprit.where() == "repro/per_token_loop.py:26-30"
    assert culprit.code.startswith("for t in range(x.shape[1]):")
    # the stored lines are what is shown: a different file at that path changes nothing
    stored["lines"]["26"] = "for t in stored_only:"
    assert carried_sources(record.evidence.source).code_at(loop_file, 26) == \
        "for t in stored_only:"
    # a record of a receiver's paths stores nothing of them
    assert capture({"where": "/etc/shadow:1 in f", "file": "/dev/zero", "line": 1,
                    "text": 'File "/proc/self/environ", line 1, in f'}) == {"files": {}}


@pytest.mark.parametrize("text, shown", [
    (HOSTILE_TEXT, "boom OK (healthy) end"),
    ("line one\r\nline two\ttab\n", "line one\nline two\ttab\n"),
    ("unterminated title \x1b]0;never ends", "unterminated title "),
    ("8-bit \x9d0;title\x9c and \x9b31mred", "8-bit  and red"),
    ("bidi \u202eevil\u202c and NUL\x00 ESC alone \x1b", "bidi evil and NUL ESC alone "),
    ("plain text, Unicode ü, ∑, 日本", "plain text, Unicode ü, ∑, 日本"),
])
def test_control_characters_and_escape_sequences_are_removed(text, shown):
    assert clean(text) == shown
    assert "\x1b" not in clean(text) and not any(0x80 <= ord(c) < 0xA0 for c in clean(text))
    assert "\n" not in clean_line(text) and "\t" not in clean_line(text)


def _escapes_dir(tmp_path: Path) -> Path:
    facts = {"exception_type": "RuntimeError", "message": HOSTILE_TEXT,
             "where": f"{REPRO / 'per_token_loop.py'}:28 in forward"}
    record = _run_record(str(tmp_path / "escapes"), "ERROR", facts, result={
        "status": "error", "exception": {"type": "RuntimeError", "message": HOSTILE_TEXT,
                                         "traceback": f"RuntimeError: {HOSTILE_TEXT}\n"}})
    record.spec = replace(record.spec, command=("python", f"train{TITLE}.py", CURSOR))
    record.verdict.reasons = [f"raised RuntimeError: {HOSTILE_TEXT}"]
    run = _plant_run(tmp_path / "escapes", record)
    (run / "stderr.txt").write_text(f"Traceback\nRuntimeError: {HOSTILE_TEXT}\n")
    return run


PLANTED = ("\x1b[1A", "\x1b[2K", "\x1b]52", "cGxhbnRlZC1jbGlwYm9hcmQ", "\x1b]0;",
           "planted-title", "\x9b", "\x07")


def test_escape_sequences_in_a_record_reach_neither_the_terminal_nor_the_files(tmp_path):
    run = _escapes_dir(tmp_path)
    piped = nsadiag("report", str(run), timeout=RENDER_TIMEOUT_S)
    assert piped.returncode == 0, piped.stderr
    assert "proof: RuntimeError: boom OK (healthy)" in piped.stdout  # shown, on its line
    assert "\x1b" not in piped.stdout + piped.stderr
    for name in ("report.md", "summary.json"):
        text = (run / name).read_text()
        assert not any(c in text for c in ("\x1b", "\x9b", "\x9d", "\x07", "\r")), name
        assert "boom OK (healthy)" in text, name
    shown = in_pty([sys.executable, "-m", "nsadiag.cli", "report", str(run)],
                   deadline_s=RENDER_TIMEOUT_S, cwd=REPO)
    assert shown.returncode == 0, shown.output[-2000:]
    assert "boom OK (healthy)" in shown.output
    assert not [s for s in PLANTED if s in shown.output], shown.output[-2000:]


def test_a_moved_directorys_trials_are_found_and_a_planted_ones_refused(tmp_path, home):
    root = tmp_path / "received"
    (root / "trial-1").mkdir(parents=True)
    (root / "trial-7").symlink_to(home, target_is_directory=True)
    with runfiles.rendering(root) as not_read:
        assert runfiles.trial_dir(str(root / "trial-1")) == (root / "trial-1").resolve()
        assert runfiles.trial_dir("/elsewhere/runs/sweep/trial-1") == root / "trial-1"
        assert runfiles.trial_dir("/") is None
        assert runfiles.trial_dir(str(home)) is None
        assert runfiles.trial_dir("/elsewhere/trial-7") is None  # a link out of the directory
        assert runfiles.read_bytes(home / ".ssh" / "id_rsa", 2**20, "dump") is None
    assert not_read == ["trial_dir '/': outside the run directory, ignored",
                        f"trial_dir {str(home)!r}: outside the run directory, ignored",
                        "trial_dir '/elsewhere/trial-7': outside the run directory, ignored",
                        f"dump {str(home / '.ssh' / 'id_rsa')!r}: outside the run directory, "
                        f"not read"]
    assert runfiles.trial_dir("/") == Path("/")  # outside a render: the path as written


def test_the_watched_programs_own_output_passes_through_as_it_wrote_it(tmp_path):
    """Only nsadiag's renderings are cleaned: the program's escapes reach the terminal,
    nsadiag's own lines about its argv carry none, nor do report.md and summary.json."""
    red = "\x1b[31mred\x1b[0m"
    done = nsadiag("run", "--out", str(tmp_path / "run"), "--", sys.executable, "-c",
                   "import sys; print(sys.argv[1]); raise SystemExit(sys.argv[1])", red,
                   timeout=RENDER_TIMEOUT_S)
    assert done.returncode == 1, done.stderr
    program = [line for line in (done.stdout + done.stderr).splitlines() if red in line]
    assert len(program) == 2  # printed, and the exit message
    ours = [line for line in (done.stdout + done.stderr).splitlines() if red not in line]
    assert any("watching" in line for line in ours) and any("ERROR" in line for line in ours)
    assert not [line for line in ours if "\x1b" in line], ours
    for name in ("report.md", "summary.json"):
        assert "\x1b" not in (tmp_path / "run" / name).read_text(), name
