"""The small answers a newcomer meets first say what happened in their words: a script
that does not exist, a PID that is not Python, the kinds a finding can have, what a
trial is doing, and --help without a type on flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nsadiag.cli.render import activity
from nsadiag.finding import KINDS, kind_of
from nsadiag.harness.runcmd import unopened_script
from nsadiag.verdict.names import NAMES
from tests.helpers import REPO, checkout_env, nsadiag


def test_a_script_that_does_not_exist_is_one_line_and_no_verdict(tmp_path):
    out = tmp_path / "run"
    done = nsadiag("run", "--no-redact", "--out", str(out), "--", sys.executable, "missing.py",
                   cwd=tmp_path, env=checkout_env())
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("nsadiag: error:")]
    assert errors == [f"nsadiag: error: command: {os_name(sys.executable)} cannot open the "
                      f"script '{tmp_path / 'missing.py'}': No such file or directory"]
    assert "ERROR" not in done.stdout + done.stderr and "exception" not in done.stderr
    assert not out.exists()  # a refused command leaves no run directory


def os_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


@pytest.mark.parametrize("returncode,stderr", [
    (1, "python: can't open file '/x/a.py': [Errno 2] No such file or directory\n"),
    (2, "usage: train.py [-h]\ntrain.py: error: unrecognized arguments: --lr\n"),
    (2, "Traceback (most recent call last):\n  File \"t.py\", line 1\nSystemExit: 2\n"
        "python: can't open file '/x/a.py': [Errno 2] No such file or directory\n"),
])
def test_only_the_interpreters_own_line_alone_counts_as_a_script_not_opened(returncode,
                                                                             stderr):
    assert unopened_script(returncode, stderr) is None


def test_a_script_that_cannot_be_read_is_named_with_the_reason():
    line = "/usr/bin/python3: can't open file '/x/a.py': [Errno 13] Permission denied\n"
    assert unopened_script(2, line) == "python3 cannot open the script '/x/a.py': " \
                                       "Permission denied"


def test_attach_to_a_process_that_is_not_python_says_so(tmp_path):
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        out = tmp_path / "attach"
        done = nsadiag("attach", str(sleeper.pid), "--duration", "1", "--out", str(out))
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"nsadiag: error: pid: process {sleeper.pid} (sleep) is not a Python process; attach "
        f"watches Python programs (give the PID of the python process)")
    assert "DEADLOCK" not in done.stdout + done.stderr and not out.exists()


def test_every_kind_a_finding_can_have_is_listed_and_in_the_schema():
    made = {kind_of(name, slow_by) for name in NAMES for slow_by in ("size", "defect", None)}
    assert made <= set(KINDS)
    assert "slow, work not counted" in made
    schema = json.loads((REPO / "nsadiag" / "schemas" / "summary.schema.json").read_text())
    assert schema["$defs"]["finding"]["properties"]["kind"]["enum"] == list(KINDS)


@pytest.mark.parametrize("event,words", [
    ({"kind": "module", "phase": "forward", "step": 2, "module": "layers.3"},
     "forward of layers.3 (step 3)"),
    ({"kind": "start", "phase": "build", "step": 0}, "building the model"),
    ({"kind": "start", "phase": "backward", "step": 0}, "backward (step 1)"),
    ({"kind": "step", "phase": "optimizer", "step": 5}, "step 6 done"),
    ({"kind": "end", "phase": "optimizer", "status": "ok"}, "finished"),
    ({"kind": "pulse", "progress": True, "frame": "attend (model.py:42)"},
     "running in attend (model.py:42)"),
    ({"kind": "pulse", "progress": False, "frame": None}, "no progress"),
    ({"kind": "collective", "phase": "backward", "step": 1, "n": 7, "op": "all_reduce"},
     "all_reduce #7 (step 2)"),
])
def test_what_a_trial_is_doing_reads_in_words(event, words):
    assert activity(event) == words


def test_help_shows_no_type_for_flags():
    for command in ([], ["run"], ["sweep-layers"], ["attach"]):
        done = subprocess.run([sys.executable, "-m", "nsadiag.cli", *command, "--help"],
                              capture_output=True, text=True, cwd=REPO, timeout=120,
                              env={**checkout_env(), "COLUMNS": "200"})
        assert done.returncode == 0, done.stderr
        assert "<bool>" not in done.stdout, done.stdout
    assert "--no-redact " in done.stdout  # the flags are still there
    assert "PyTorch training runs" in subprocess.run(
        [sys.executable, "-m", "nsadiag.cli", "--help"], capture_output=True, text=True,
        cwd=REPO, timeout=120).stdout
