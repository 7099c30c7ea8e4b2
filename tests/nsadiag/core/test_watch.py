"""nsadiag.watch(): a block watched in its own process by a helper that never stops it:
a stall gets its verdict and report while the block still hangs, a finished block is OK
or ERROR, and leaving the block removes every hook and ends the helper."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = textwrap.dedent("""
    import json, os, sys, threading, time
    import torch
    from torch import nn
    from torch.nn.modules import module as module_mod
    import nsadiag

    mode, out = sys.argv[1], sys.argv[2]
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stats_lock = threading.Lock()
    seen = {}

    def release_after_the_verdict(watched):
        deadline = time.time() + 180
        while watched.verdict is None and time.time() < deadline:
            time.sleep(0.2)
        seen["verdict_while_hung"] = watched.verdict
        stats_lock.release()

    try:
        with nsadiag.watch(out=out, stall_timeout=3) as watched:
            for step in range(4):
                model(torch.randn(8, 16)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                if mode == "deadlock" and step == 1:
                    stats_lock.acquire()
                    threading.Thread(target=release_after_the_verdict, args=(watched,)).start()
                    stats_lock.acquire()  # waits until another thread releases it
                if mode == "error" and step == 2:
                    raise ValueError("the loader returned an empty batch")
    except ValueError as exc:
        seen["raised"] = str(exc)
    seen.update(after=watched.verdict, pid=os.getpid(),
                hooks=len(module_mod._global_forward_pre_hooks),
                helper_alive=watched.helper.poll() is None)
    print(json.dumps(seen), flush=True)
""")


def watch_script(tmp_path: Path, mode: str) -> tuple[dict, dict, dict]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), mode, str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    out = tmp_path / "out"
    return (seen, json.loads((out / "summary.json").read_text()),
            json.loads((out / "record.json").read_text()))


def test_a_deadlock_inside_the_block_is_reported_while_it_hangs_and_not_killed(tmp_path):
    seen, summary, record = watch_script(tmp_path, "deadlock")
    # the helper wrote the verdict while the block hung; the block then went on and ended
    assert seen["verdict_while_hung"] == "DEADLOCK"
    assert seen["after"] == "DEADLOCK" and summary["command"] == "watch"
    facts = record["verdict"]["facts"]
    assert facts["wait_frame"].startswith("<module> (train.py:")
    assert "stats_lock.acquire()" in " ".join(record["verdict"]["reasons"])
    assert json.loads((tmp_path / "out" / "block.json").read_text())["status"] == "ok"
    assert seen["hooks"] == 0 and not seen["helper_alive"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("# nsadiag watch: ❌ DEADLOCK (stuck) at train.py:")
    assert summary["finding"]["culprit"]["code"].startswith("stats_lock.acquire()")


def test_a_finished_block_is_ok_with_its_steps(tmp_path):
    seen, summary, record = watch_script(tmp_path, "ok")
    assert summary["verdict"] == "OK", summary["headline"]
    assert record["verdict"]["reasons"][0].startswith("the watched block finished 4 of 4 steps")
    process = record["evidence"]["processes"][0]
    assert process["pid"] == seen["pid"] and process["events"]["step"] == 4
    assert seen["hooks"] == 0 and not seen["helper_alive"]


def test_an_exception_in_the_block_is_an_error_naming_it_and_still_raised(tmp_path):
    seen, summary, record = watch_script(tmp_path, "error")
    assert seen["raised"] == "the loader returned an empty batch"
    assert summary["verdict"] == "ERROR"
    assert summary["finding"]["proof"] == "ValueError: the loader returned an empty batch"
    assert summary["headline"].startswith("ERROR (crashed) at train.py:")


@pytest.mark.parametrize("kwargs, message", [
    ({"stall_timeout": 0}, "stall_timeout: must be > 0 seconds"),
    ({"deadline": -1}, "deadline: must be > 0 seconds or None"),
])
def test_bad_arguments_are_one_line(tmp_path, kwargs, message):
    import nsadiag

    with pytest.raises(ValueError, match=message):
        nsadiag.watch(out=tmp_path / "out", **kwargs)
