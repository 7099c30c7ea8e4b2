"""A parent that joins a child before reading what the child put on a multiprocessing.Queue
waits for a child that waits for it: the chain goes into the child's own threads and names
the feeder thread blocked on the pipe the parent holds, and the Next reads the queue
first."""

from __future__ import annotations

import json
import sys
import textwrap

from tests.helpers import checkout_env, nsadiag

JOIN_BEFORE_GET = textwrap.dedent("""
    import multiprocessing as mp
    import torch

    def compute(q):
        q.put(torch.randn(1000, 1000).numpy().tobytes())

    if __name__ == "__main__":
        model = torch.nn.Linear(4, 4)
        model(torch.randn(2, 4)).sum().backward()
        torch.optim.SGD(model.parameters(), 0.1).step()
        q = mp.Queue()
        p = mp.Process(target=compute, args=(q,))
        p.start()
        p.join()
        print(len(q.get()))
""")


def test_a_queue_joined_before_it_is_read_is_a_child_waiting_for_its_parent(tmp_path):
    script = tmp_path / "join_first.py"
    script.write_text(JOIN_BEFORE_GET)
    out = tmp_path / "run"
    done = nsadiag("run", "--stall-timeout", "5", "--out", str(out), "--", sys.executable,
                   str(script), env=checkout_env())
    assert done.returncode == 1, done.stderr
    finding = json.loads((out / "summary.json").read_text())["finding"]
    assert finding["verdict"] == "DEADLOCK"
    assert finding["culprit"]["where"] == "join_first.py:15"
    assert "thread QueueFeederThread of pid " in finding["chain"]
    assert "is blocked writing into pipe:[" in finding["chain"]
    assert finding["next_action"].startswith("Read the queue before waiting for the child "
                                             "to exit at join_first.py:15: `q.get()` before "
                                             "`p.join()`")
