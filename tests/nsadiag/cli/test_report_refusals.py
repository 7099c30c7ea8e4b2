"""`nsadiag report` writes nothing into a directory that holds no run of nsadiag's (an
/etc, an empty directory, /proc/self, the user's cwd): one line, exit 2, no lock file; and
a run whose nsadiag was killed before its verdict says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.helpers import REPO, checkout_env, nsadiag
from tests.procs import wait_for


def _refused(path, cwd=REPO) -> str:
    done = nsadiag("report", str(path), cwd=cwd)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    return line


def test_a_directory_of_other_files_is_refused_and_nothing_is_written(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "sub").mkdir()
    line = _refused(tmp_path)
    assert line.endswith("is not an nsadiag run directory (it holds notes.txt, sub/); "
                         "nothing was written: give a directory that an nsadiag command wrote")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "sub"]
    assert nsadiag("report", str(tmp_path), "--bundle").returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "sub"]


def test_an_empty_directory_and_proc_self_are_refused(tmp_path):
    assert _refused(tmp_path).endswith("is not an nsadiag run directory (it is empty); nothing "
                                       "was written: give a directory that an nsadiag command "
                                       "wrote")
    assert list(tmp_path.iterdir()) == []
    assert "/proc/self is not an nsadiag run directory" in _refused("/proc/self")


def test_report_of_the_cwd_given_as_an_empty_word_is_refused(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    assert "run_dir: . is not an nsadiag run directory (it holds train.py)" in \
        _refused("", cwd=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]


def test_a_run_killed_before_its_verdict_is_said_so(tmp_path):
    out = tmp_path / "run"
    watcher = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(out),
                                "--", sys.executable, "-c",
                                "import time; print('going', flush=True); time.sleep(120)"],
                               cwd=REPO, env=checkout_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: (out / "stdout.txt").exists() and
                 "going" in (out / "stdout.txt").read_text(), 120, "the run")
        os.killpg(watcher.pid, signal.SIGKILL)
        watcher.wait(timeout=60)
    finally:
        watcher.kill()
    line = _refused(out)
    assert line.startswith("nsadiag: error: report: the run in ") and line.endswith(
        " never got its verdict: the nsadiag watching it ended before it wrote record.json "
        "(killed, or the machine went down); the command's output so far is in stdout.txt and "
        "stderr.txt; run the command again"), line
