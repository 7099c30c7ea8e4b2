"""`--out` never deletes what nsadiag did not write: a directory of the user's is refused
untouched (exit 2, one line naming what is there), `--out .` in a project as well, and a
rerun in a run directory with the user's files beside the run replaces only nsadiag's
files, whether it finishes, is interrupted or is refused."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, checkout_env, nsadiag
from tests.procs import wait_for


def _user_files(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` that is not nsadiag's, by relative path, with a
    digest of its bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "data").mkdir(exist_ok=True)
    (directory / "thesis.tex").write_text("precious\n")
    (directory / "data" / "ckpt.pt").write_bytes(os.urandom(65536))
    # names that look like nsadiag's inside a directory of the user's are the user's too
    (directory / "data" / "report.md").write_text("the user's own report\n")
    return _digests(directory, ["thesis.tex", "data/ckpt.pt", "data/report.md"])


def _digests(directory: Path, names: list[str]) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
            for name in names}


def _run(out: Path | str, *code: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return nsadiag("run", "--out", str(out), "--", sys.executable, "-c", *code, cwd=cwd,
                   env=checkout_env())


def test_a_directory_of_the_users_is_refused_and_nothing_in_it_is_touched(tmp_path):
    out = tmp_path / "d"
    kept = _user_files(out)
    listing = sorted(p.name for p in out.iterdir())
    done = _run(out, "print(1)")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("nsadiag: error: out: ") and \
        "already holds files nsadiag did not write (data/, thesis.tex); nothing was " \
        "touched" in line, line
    assert _digests(out, list(kept)) == kept
    assert sorted(p.name for p in out.iterdir()) == listing  # no lock, no marker, no record


def test_out_dot_in_a_project_is_refused_with_its_files_named(tmp_path):
    project = tmp_path / "project"
    kept = _user_files(project)
    done = _run(".", "print(1)", cwd=project)
    assert done.returncode == 2, done.stderr
    assert "out: . already holds files nsadiag did not write (data/, thesis.tex)" in \
        done.stderr, done.stderr
    assert _digests(project, list(kept)) == kept
    assert sorted(p.name for p in project.iterdir()) == ["data", "thesis.tex"]


def test_an_empty_directory_becomes_a_run_directory(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    done = _run(out, "print('in an empty one')")
    assert done.returncode == 0, done.stderr
    assert (out / "stdout.txt").read_text() == "in an empty one\n"
    assert (out / ".nsadiag-run").is_file()


def test_a_rerun_beside_the_users_files_replaces_only_nsadiags(tmp_path):
    out = tmp_path / "run"
    assert _run(out, "print('first')").returncode == 0
    kept = _user_files(out)
    first_procs = {p.name for p in out.glob("proc-*")}
    done = _run(out, "print('second')")
    assert done.returncode == 0, done.stderr
    assert (out / "stdout.txt").read_text() == "second\n"
    assert not first_procs & {p.name for p in out.glob("proc-*")}
    assert _digests(out, list(kept)) == kept
    assert not list(out.glob(".nsadiag-earlier-*"))


def test_an_interrupted_rerun_beside_the_users_files_keeps_them(tmp_path):
    out = tmp_path / "run"
    assert _run(out, "print('first')").returncode == 0
    kept = _user_files(out)
    second = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(out),
                               "--", sys.executable, "-c",
                               "import time; print('second', flush=True); time.sleep(120)"],
                              cwd=REPO, env=checkout_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (out / "stdout.txt").exists() and
                 "second" in (out / "stdout.txt").read_text(), 120, "the second run")
        # the earlier run's files are set aside inside the directory; the user's stay put
        assert _digests(out, list(kept)) == kept
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=120)
    finally:
        second.kill()
    assert second.returncode == 143, err
    assert "interrupted by SIGTERM" in (out / "report.md").read_text()
    assert _digests(out, list(kept)) == kept


def test_a_refused_command_in_a_run_directory_with_the_users_files_keeps_everything(
        tmp_path):
    out = tmp_path / "run"
    assert _run(out, "print('first')").returncode == 0
    kept = _user_files(out)
    refused = nsadiag("run", "--out", str(out), "--", str(tmp_path / "no-such-program"),
                      env=checkout_env())
    assert refused.returncode == 2, refused.stderr
    assert _digests(out, list(kept)) == kept
    assert (out / "stdout.txt").read_text() == "first\n"  # the earlier run is whole
