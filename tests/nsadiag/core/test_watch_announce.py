"""nsadiag.watch() says so where the user looks: a block stuck on a lock before its first
forward pass is a stall after stall_timeout (the start-up grace covers starting up, not a
wait), and the verdict is printed once, through sys.stderr as the block's caller has it
(a notebook's cell stream here: an object that is no file), while the block still hangs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers import REPO

SCRIPT = textwrap.dedent("""
    import json, sys, threading, time
    import torch
    from torch import nn
    import nsadiag

    class CellStream:
        # what a notebook puts in sys.stderr: an object that collects text for the cell
        def __init__(self):
            self.lines = []

        def write(self, text):
            self.lines.append(text)
            return len(text)

        def flush(self):
            pass

    out = sys.argv[1]
    cell = CellStream()
    sys.stderr = cell
    loader_lock = threading.Lock()
    seen = {}

    def release_after_the_verdict(watched):
        deadline = time.time() + 180
        while not cell.lines and time.time() < deadline:
            time.sleep(0.2)
        seen["verdict_while_hung"] = watched.verdict
        seen["cell_while_hung"] = "".join(cell.lines)
        time.sleep(1.0)  # a second announcement would come within a poll
        loader_lock.release()

    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader_lock.acquire()
    with nsadiag.watch(out=out, stall_timeout=4) as watched:
        threading.Thread(target=release_after_the_verdict, args=(watched,)).start()
        loader_lock.acquire()  # the data loader's lock, before the first forward pass
        for step in range(2):
            model(torch.randn(8, 16)).pow(2).mean().backward()
            optimizer.step()
    seen.update(after=watched.verdict, cell="".join(cell.lines), announced=watched.announced)
    print(json.dumps(seen), flush=True)
""")


def test_a_wait_before_the_first_forward_is_a_stall_announced_once(tmp_path):
    script = tmp_path / "notebook_cell.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(script), str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["verdict_while_hung"] == "DEADLOCK", seen  # not OK: no 30 s grace for a wait
    summary = json.loads((out / "summary.json").read_text())
    line = f"nsadiag.watch: {summary['headline']} (report: {out / 'report.md'})\n"
    assert summary["headline"].startswith("DEADLOCK (stuck)")
    assert summary["finding"]["proof"].startswith("no progress for 4")  # the stall limit
    assert seen["cell_while_hung"] == line  # printed while the block hung, into the cell
    assert seen["cell"] == line and seen["announced"] == line.rstrip("\n")  # once
    assert "nsadiag.watch:" not in done.stderr  # the cell, not the process's stderr file
