"""The plain-script zoo (repro/scripts/) through `nsadiag run`: each script gets the
verdict its docstring states, and no process is left once nsadiag exits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.procs import owned_by, with_cmdline

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "repro" / "scripts"


def nsadiag_run(tmp_path: Path, options: list[str], command: list[str],
                timeout: float = 400) -> tuple[subprocess.CompletedProcess, dict, dict, float]:
    """Run `nsadiag run OPTIONS -- COMMAND`; (process, summary, record, exit time)."""
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", *options, "--out",
                             str(tmp_path / "run"), "--", *command], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=timeout)
    exited = time.time()
    assert owned_by(proc.pid) == [], "a process of the command outlived nsadiag"
    assert with_cmdline(str(SCRIPTS)) == [], "a script process outlived nsadiag"
    run = tmp_path / "run"
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return (done, json.loads((run / "summary.json").read_text()),
            json.loads((run / "record.json").read_text()), exited)


def test_per_token_loop_is_slow_at_the_deadline(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--deadline", "15", "--stall-timeout", "30"],
        [sys.executable, str(SCRIPTS / "slow_token_loop.py")])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "SLOW", summary["headline"]
    reasons = " ".join(record["verdict"]["reasons"])
    assert "still progressing" in reasons
    assert "loop variable `t` in forward (slow_token_loop.py:" in reasons
    assert record["verdict"]["facts"]["steps_done"] >= 1


def test_lock_taken_in_a_gradient_hook_is_a_deadlock_naming_the_line(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--stall-timeout", "5"],
        [sys.executable, str(SCRIPTS / "grad_hook_deadlock.py")])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "DEADLOCK", summary["headline"]
    facts = record["verdict"]["facts"]
    assert facts["wait_frame"].startswith("record_norm (grad_hook_deadlock.py:")
    assert "with stats_lock:" in " ".join(record["verdict"]["reasons"])


def test_extra_all_reduce_on_one_rank_is_stall_collective_naming_it(tmp_path):
    stall_timeout = 10.0
    done, summary, record, exited = nsadiag_run(
        tmp_path, ["--stall-timeout", str(stall_timeout)],
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(SCRIPTS / "ddp_extra_allreduce.py")])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "STALL-COLLECTIVE", summary["headline"]
    facts = record["verdict"]["facts"]
    assert facts["odd_ranks"] == [1]
    rows = {row["rank"]: row for row in facts["ranks"]}
    line = next(i for i, text in enumerate((SCRIPTS / "ddp_extra_allreduce.py").read_text()
                                            .splitlines(), 1)
                if text.strip().startswith("dist.all_reduce(overflow"))
    assert rows[1]["waiting"].endswith(f"from main (ddp_extra_allreduce.py:{line}))")
    assert rows[0]["waiting"].startswith("all_reduce #3 (DDP bucket 0")
    assert summary["failing"]["reasons"][0].startswith("rank 1 waits in all_reduce #3")
    # the line blamed is the collective only rank 1 issues
    assert summary["finding"]["culprit"]["where"] == f"ddp_extra_allreduce.py:{line}"
    # the verdict came within the stall timeout + 30 s of the ranks' last progress
    last = max(json.loads(line)["t"] for path in (tmp_path / "run").glob("proc-*/events.jsonl")
               for line in path.read_text().splitlines()
               if '"kind":"pulse"' not in line and line.strip())
    assert exited - last < stall_timeout + 30, exited - last


def test_helpers_in_new_sessions_are_gone_after_an_ok_verdict(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, [], [sys.executable, str(SCRIPTS / "new_session_helper.py")])
    assert done.returncode == 0, done.stderr
    assert summary["verdict"] == "OK", summary["headline"]
    assert record["verdict"]["reasons"][0].startswith("the command finished 3 of 3 steps")
    helpers = [p for p in json.loads((tmp_path / "run" / "evidence.json").read_text())
               ["processes"] if p["events"].get("start")]
    assert len(helpers) >= 3, "the script and both helpers were watched"
    assert with_cmdline("nsadiag repro: log shipper") == []
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["command_name"] == "run" and meta["argv"][-1].endswith("new_session_helper.py")
