"""A stranger's script whose DataLoader workers copy the dataset they were forked with (a
pre-tokenized corpus held as a list of dicts: copy-on-read, pytorch#13246), run unchanged
under `nsadiag run` from its own directory: with a deadline, the report names the workers'
growth, the cause and the attribute whatever the verdict; under a memory limit that kills
it, the top block does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, checkout_env, nsadiag

SCRIPT = FIXTURES / "memory" / "tokenized_corpus.py"
GUARD = FIXTURES / "memory" / "memory_guard.py"
RECORDS = "150000"  # about 400 MiB of Python objects in the training process
LARGER = "400000"  # the kernel's limit also charges each worker's start (about 50 MiB)
V1_MEMORY = Path("/sys/fs/cgroup/memory")
WORKING = 96 * 2**20
"""The workers' private memory at which a test sets the limit: they are copying by then."""


def _checkout(tmp_path: Path) -> Path:
    own = tmp_path / "their-project"
    own.mkdir()
    shutil.copy(SCRIPT, own / "train.py")
    return own


def _finding(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())["finding"]


def _names_the_copying(run: Path, finding: dict, records: str = RECORDS) -> None:
    report = (run / "report.md").read_text()
    assert "## Process memory" in report
    assert report.count("DataLoader worker (forked by") == 2
    assert (run / "process-memory.png").stat().st_size > 0
    listed = f"`TokenizedCorpus.examples` (a list of {int(records):,} dict"
    assert any("copy-on-read" in item["text"] and listed in item["text"]
               for item in finding["implicated"])
    assert any(item["text"].startswith("DataLoader worker pid ") and "private memory" in
               item["text"] and "while the memory it shares with pid" in item["text"]
               for item in finding["results"])


def test_copy_on_read_is_named_whatever_the_verdict(tmp_path: Path) -> None:
    own = _checkout(tmp_path)
    run = tmp_path / "run"
    done = nsadiag("run", "--deadline", "30", "--out", str(run), "--", sys.executable,
                   "train.py", RECORDS, "90", cwd=own, env=checkout_env())
    assert done.returncode in (0, 1), done.stderr[-2000:]
    finding = _finding(run)
    assert finding["verdict"] in ("SLOW", "OK")
    _names_the_copying(run, finding)
    fixes = [finding["next_action"], *finding["recommendations"]]
    assert any(fix.startswith("Hold `examples` without a Python object per item") and
               "`worker_init_fn`" in fix for fix in fixes)
    assert "train.py:15" not in finding["headline"]  # what failed is not the copying


def _killed_under_a_limit(finding: dict, run: Path, records: str = RECORDS) -> None:
    _names_the_copying(run, finding, records)
    culprit = finding["culprit"]
    assert (culprit["file"], culprit["line"], culprit["code"]) == \
        ("train.py", 15, "self.examples = []")
    assert "copy-on-read" in finding["proof"]
    assert finding["next_action"].startswith("Hold `examples` without a Python object")
    top = (run / "report.md").read_text().splitlines()[:6]
    assert top[0].endswith("at train.py:15")
    assert top[2].startswith("- **Line:** `train.py:15` `self.examples = []`")


def test_a_memory_limit_that_kills_it_puts_the_copying_on_top(tmp_path: Path) -> None:
    own = _checkout(tmp_path)
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(GUARD), "+100", "--", sys.executable, "-m", "nsadiag.cli", "run",
         "--out", str(run), "--", sys.executable, "train.py", LARGER, "90"],
        cwd=own, env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert "memory_guard:" in done.stderr, done.stderr[-2000:]
    assert done.returncode == 1, done.stderr[-2000:]
    finding = _finding(run)
    # the guard kills the training process (CRASH: a SIGKILL from outside) or a worker,
    # which the DataLoader then reports (ERROR, naming its pid)
    assert finding["verdict"] in ("CRASH", "ERROR"), finding["summary"]
    if finding["verdict"] == "CRASH":
        assert finding["proof"].startswith("killed by a SIGKILL nsadiag did not send")
    else:
        assert "before it was killed" in finding["proof"]
    _killed_under_a_limit(finding, run, LARGER)


def _v1_group() -> Path | None:
    group = V1_MEMORY / f"nsadiag-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(4 * 2**30))
    except OSError:
        if group.is_dir():
            group.rmdir()
        return None
    return group


def _private(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def _limit_when_copying(group: Path, run: Path, proc: subprocess.Popen, margin: int) -> int:
    """Once the forked workers (their notes name them) hold WORKING bytes of private memory
    between them, the group's limit: what it holds then plus ``margin`` bytes (its page
    cache included, as the kernel charges it)."""
    while proc.poll() is None:
        workers = [int(p.stem.split("-")[1]) for p in run.glob("proc-*/fork-*.json")]
        if len(workers) >= 2 and sum(map(_private, workers)) >= WORKING:
            limit = int((group / "memory.usage_in_bytes").read_text()) + margin
            (group / "memory.limit_in_bytes").write_text(str(limit))
            return limit
        time.sleep(0.1)
    raise AssertionError("the command ended before its workers copied anything")


def test_the_kernels_oom_killer_at_a_cgroup_limit_is_oom(tmp_path: Path) -> None:
    group = _v1_group() if V1_MEMORY.is_dir() and os.geteuid() == 0 else None
    if group is None:
        pytest.skip("no memory cgroup (v1) can be made here")
    own = _checkout(tmp_path)
    run = tmp_path / "run"
    try:
        proc = subprocess.Popen(
            ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh",
             sys.executable, "-m", "nsadiag.cli", "run", "--out", str(run), "--",
             sys.executable, "train.py", LARGER, "90"],
            cwd=own, env=checkout_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        limit = _limit_when_copying(group, run, proc, 100 * 2**20)
        _, stderr = proc.communicate(timeout=300)
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            subprocess.run(["kill", "-9", pid], check=False)
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert proc.returncode == 1, stderr[-2000:]
    finding = _finding(run)
    # the kernel kills the training process or a worker (the DataLoader then raises)
    assert finding["verdict"] == "OOM", finding["summary"]
    assert "killed by a SIGKILL" not in finding["proof"]
    summary = " ".join(finding["summary"])
    assert "OOM killer" in summary or "OOM killer" in " ".join(
        item["text"] for item in finding["results"]), (limit, summary)
    _killed_under_a_limit(finding, run, LARGER)
