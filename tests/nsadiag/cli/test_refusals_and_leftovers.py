"""Round three of the smaller hostile cases: sizes and words a parser or a clock cannot take
are one line and exit 2 (no traceback, no internal error, no run directory left); a record
nested hundreds of levels deep is refused in one line; a full disk at the start leaves no
lock file and names the directory; an earlier run that a killed rerun left set aside is
named at the next run and report and removed once a run finishes; the report's Run line
quotes the command as a shell would take it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from nsadiag.rundir import append_record, load_records
from tests.helpers import REPO, checkout_env, nsadiag, one_step_record
from tests.procs import wait_for


@pytest.mark.parametrize("args, says", [
    (["sweep-layers", "--layers", "1-99999999999999999999999999999"],
     "layers: '1-99999999999999999999999999999' names more than 1000000 layer counts"),
    (["attach", "1", "--duration", "1e12"],
     "duration: 1e+12 s (1.16e+07 days) is longer than the longest watch"),
    (["attach", "1", "--duration", "nan"], "duration: must be >= 1 seconds, got nan"),
    (["attach", "1", "--duration", "inf"], "duration: inf s (inf days) is longer than"),
    (["stacks", "1", "--samples", "100000000", "--interval", "1e9"],
     "samples: 100000000 samples 1e+09 s apart take 1e+17 s (1.16e+12 days) per process; "
     "the limits are 10000 samples and"),
    (["stacks", "1", "--samples", "3000", "--interval", "1e4"],
     "interval: 3000 samples 10000 s apart take 3e+07 s (347 days)"),
    (["run", "--bogus", "--", "true"], "No such option: --bogus (see nsadiag run --help)"),
    (["--version", "extra"], "version: --version takes no other arguments, got 'extra'"),
])
def test_what_no_parser_or_clock_takes_is_one_line_and_exit_2(tmp_path, args, says):
    done = nsadiag(*args, "--out", str(tmp_path / "out")) if args[0] in ("attach", "stacks") \
        else nsadiag(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no run directory, no runs/


@pytest.mark.parametrize("depth", [600, 900])
def test_a_record_nested_hundreds_deep_is_one_line(tmp_path, depth):
    nested: object = "leaf"
    for _ in range(depth):
        nested = {"k": nested}
    record = one_step_record(1).to_dict()
    record["verdict"]["facts"]["planted"] = nested
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"command_name": "run"}))
    (run / "record.json").write_text(json.dumps(record))
    done = nsadiag("report", str(run))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "record.json" in done.stderr and "nests too deeply to read (more than 100 " \
        "levels)" in done.stderr
    trials = tmp_path / "trials.jsonl"
    append_record(trials, one_step_record(1))
    with open(trials, "a") as f:
        f.write(json.dumps(record) + "\n")
    skipped: list[str] = []
    assert len(load_records(trials, skipped)) == 1
    assert skipped == ["trials.jsonl line 2: nested more than 100 levels deep"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="mounts a full tmpfs in a mount namespace of its own (root)")
def test_a_full_disk_at_the_start_leaves_no_lock_and_names_the_directory(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    nsadiag_cli = f"{sys.executable} -m nsadiag.cli run --out"
    script = (f"mount -t tmpfs -o size=1m tmpfs {disk} && mkdir {disk}/existing && "
              f"(head -c 2000000 /dev/zero > {disk}/fill 2>/dev/null; true) && cd {REPO} && "
              f"{nsadiag_cli} {disk}/new -- true 2> {tmp_path}/new.txt; "
              f"echo $? >> {tmp_path}/rc.txt; "
              f"{nsadiag_cli} {disk}/existing -- true 2> {tmp_path}/existing.txt; "
              f"echo $? >> {tmp_path}/rc.txt; ls -A {disk} {disk}/existing > {tmp_path}/ls.txt")
    subprocess.run(["unshare", "-m", "sh", "-c", script], timeout=300, check=True)
    assert (tmp_path / "rc.txt").read_text().split() == ["2", "2"]
    for name in ("new", "existing"):
        said = (tmp_path / f"{name}.txt").read_text()
        # (the path as printed hides the user's name in pytest's directory)
        assert said.startswith("nsadiag: error: out: cannot write to /") and \
            said.endswith(f"/disk/{name}: No space left on device\n"), said
    listed = (tmp_path / "ls.txt").read_text()
    assert ".nsadiag.lock" not in listed and "new" not in listed, listed


def _runs_beside(out):
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".nsadiag-earlier-"))


def test_a_rerun_killed_with_sigkill_leaves_the_earlier_run_named_then_removed(tmp_path):
    out = tmp_path / "run"
    env = checkout_env()
    assert nsadiag("run", "--out", str(out), "--", sys.executable, "-c", "print('first')",
                   env=env).returncode == 0
    second = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(out),
                               "--", sys.executable, "-c",
                               "import time; print('second', flush=True); time.sleep(120)"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (out / "stdout.txt").exists() and
                 "second" in (out / "stdout.txt").read_text(), 120, "the second run")
        second.send_signal(signal.SIGKILL)
        second.wait(timeout=60)
    finally:
        second.kill()
    (aside,) = _runs_beside(out)  # the first run, where the killed rerun had put it
    assert (out / aside / "stdout.txt").read_text() == "first\n"
    report = nsadiag("report", str(out), env=env)
    assert "set aside by an nsadiag that was killed during a rerun, is in " in report.stderr
    assert f"/{aside}\n" in report.stderr, report.stderr
    third = nsadiag("run", "--out", str(out), "--", sys.executable, "-c",
                    "import sys; print(sys.argv[1])", "a b", env=env)
    assert third.returncode == 0, third.stderr
    assert f"/{aside}; it is removed once this run has its verdict" in third.stderr, \
        third.stderr
    assert _runs_beside(out) == []
    assert (out / "stdout.txt").read_text() == "a b\n"
    # the Run line quotes the command as a shell takes it back
    assert "print(sys.argv[1])' 'a b'`" in (out / "report.md").read_text()
