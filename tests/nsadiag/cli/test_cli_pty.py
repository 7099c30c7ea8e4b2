"""Every command in a terminal: the command line run on a pseudo-terminal (where rich shows
its live spinner or bar) ends with its verdict line and exit code as it does in a pipe.
`make demo`, the README's first command, is run the way a person types it (a triage, with
its live display throughout)."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

from tests.helpers import REPO
from tests.pty_cli import in_pty, screen

NSADIAG = [sys.executable, "-m", "nsadiag.cli"]
TINY = ["--set", "dim=32", "--set", "n_heads=4", "--set", "n_kv_heads=2", "--set",
        "head_dim=8", "--set", "l=8", "--set", "d=4", "--set", "l_sel=16", "--set", "n_sel=3",
        "--set", "w=16", "--seq-len", "64"]
DEADLINE_S = 300  # a command that hangs in a terminal never ends; one that works takes < 30 s
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def plain(text: str) -> str:
    return ANSI.sub("", text)


def test_env_in_a_terminal():
    done = in_pty([*NSADIAG, "env"], DEADLINE_S, cwd=REPO)
    assert done.ended, f"nsadiag env never ended in a terminal: {done.output[-2000:]!r}"
    assert done.returncode == 0, done.output
    assert done.showed_live_display
    assert re.search(r"^ *problems +", plain(done.output), re.M)


def test_sweep_layers_in_a_terminal(tmp_path):
    out = tmp_path / "run"
    done = in_pty([*NSADIAG, "sweep-layers", "--layers", "1", *TINY, "--steps", "2",
                   "--stall-timeout", "60", "--out", str(out)], DEADLINE_S, cwd=REPO)
    assert done.ended, f"sweep-layers never ended in a terminal: {done.output[-2000:]!r}"
    assert done.returncode == 0, done.output
    assert done.showed_live_display
    summary = json.loads((out / "summary.json").read_text())
    assert summary["headline"] in plain(done.output)
    assert [v["verdict"] for v in summary["verdicts"]] == ["OK"]


def test_check_in_a_terminal(tmp_path):
    out = tmp_path / "run"
    done = in_pty([*NSADIAG, "check", "ckpt", *TINY, "--out", str(out)], DEADLINE_S, cwd=REPO)
    assert done.ended, f"check never ended in a terminal: {done.output[-2000:]!r}"
    assert done.returncode == 0, done.output
    assert done.showed_live_display
    assert "1 check(s) passed" in plain(done.output)


SCRIPT = textwrap.dedent("""
    import sys
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        print(f"step {step} done", flush=True)
    print("stdout is a terminal:", sys.stdout.isatty())
    """)


def test_run_in_a_terminal(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    done = in_pty([*NSADIAG, "run", "--out", str(out), "--", sys.executable, str(script)],
                  DEADLINE_S, cwd=tmp_path)
    assert done.ended, f"nsadiag run never ended in a terminal: {done.output[-2000:]!r}"
    assert done.returncode == 0, done.output
    shown = screen(done.output)
    assert "step 2 done\n" in shown
    assert "stdout is a terminal: True\n" in shown  # as it is without nsadiag
    assert (out / "stdout.txt").read_text().endswith("step 2 done\nstdout is a terminal: True\n")
    assert json.loads((out / "summary.json").read_text())["headline"] in shown


def test_make_demo_in_a_terminal(tmp_path):
    """The Makefile's own recipe (the venv it runs in counts as installed), into tmp_path:
    SLOW naming the loop, exit 0 from make (the triage's 1, or 4 on a machine too busy)."""
    venv = Path(sys.prefix)
    out = tmp_path / "demo"
    done = in_pty(["make", "-s", "-o", str(venv / ".installed"), "demo", f"VENV={venv}",
                   f"PY={sys.executable}", f"DEMO_OUT={out}"], 2 * DEADLINE_S, cwd=REPO)
    assert done.ended, f"make demo never ended in a terminal: {done.output[-2000:]!r}"
    assert done.returncode == 0, done.output
    assert done.showed_live_display
    summary = json.loads((out / "summary.json").read_text())
    assert summary["headline"] in plain(done.output)
    assert summary["exit_code"] in (1, 4)
    assert (out / "report.md").is_file()
