"""Where a SLOW run's time goes when no loop, data wait or recompile explains it: the
model's own work (no defect, and the top block says so), or one line of the user's outside
the model's modules, backward and optimizer (named, with its share)."""

from __future__ import annotations

import json
import sys
import textwrap

from nsadiag.probes.profile import work_split
from tests.helpers import checkout_env, nsadiag

TORCH = "/venv/lib/python3.11/site-packages/torch"


def _stack(count, phase, *frames):
    return {"frames": [list(f) for f in frames], "phase": phase, "count": count,
            "module": None, "op": None}


def test_the_work_split_puts_each_sample_where_its_frames_say():
    step = ("<module>", "/home/u/train.py", 12)
    stacks = [
        _stack(5, "build", ("<module>", "/home/u/train.py", 3)),
        _stack(40, "backward", step, ("backward", f"{TORCH}/_tensor.py", 623)),
        _stack(30, "backward", ("<module>", "/home/u/train.py", 13),
               ("step", f"{TORCH}/optim/adam.py", 248)),
        _stack(20, "forward", ("<module>", "/home/u/train.py", 10),
               ("_call_impl", f"{TORCH}/nn/modules/module.py", 1784),
               ("forward", f"{TORCH}/nn/modules/linear.py", 134)),
        _stack(10, "forward", ("loss_fn", "/home/u/train.py", 8)),
    ]
    split = work_split(stacks)
    assert (split["of"], split["backward"], split["optimizer"], split["modules"],
            split["outside"]) == (100, 40, 30, 20, 10)
    assert split["outside_line"]["where"] == "loss_fn (train.py:8)"
    assert split["outside_line"]["count"] == 10


HONEST = textwrap.dedent("""
    import torch
    from torch import nn
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(),
                          nn.Linear(2048, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(128, 512), torch.randn(128, 512)
    for step in range(100000):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
""")

BROADCAST = textwrap.dedent("""
    import torch
    from torch import nn
    B = 4096
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(B, 64), torch.randn(B)

    def loss_fn(pred, target):
        return ((pred - target) ** 2).mean()

    for step in range(100000):
        loss = loss_fn(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
""")


def _slow_run(tmp_path, name, text):
    script = tmp_path / f"{name}.py"
    script.write_text(text)
    done = nsadiag("run", "--deadline", "15", "--out", str(tmp_path / name), "--",
                   sys.executable, str(script), env=checkout_env())
    assert done.returncode == 1, done.stderr
    return json.loads((tmp_path / name / "summary.json").read_text())["finding"]


def test_an_honest_compute_bound_model_is_told_no_defect_and_what_would_help(tmp_path):
    finding = _slow_run(tmp_path, "honest", HONEST)
    assert finding["verdict"] == "SLOW"
    assert finding["headline"] == "SLOW (no defect found: the model's own work)"
    assert finding["culprit"] is None
    assert finding["line_note"] == ("none: no defect found; the time goes into the model's "
                                    "own work")
    assert "the backward" in finding["proof"] and "no loop, data wait or recompile" in \
        finding["proof"]
    assert finding["next_action"].startswith("Nothing to fix: no defect was found")
    assert "tensor ops" not in finding["next_action"] and "loop" not in \
        finding["next_action"].split("Rerun")[0]
    assert "--deadline 30 --" in finding["next_action"]  # the rerun gets more time


def test_a_loss_line_doing_work_of_its_own_is_named_with_its_share(tmp_path):
    finding = _slow_run(tmp_path, "broadcast", BROADCAST)
    assert finding["culprit"]["where"] == "broadcast.py:10", finding
    assert finding["culprit"]["code"] == "return ((pred - target) ** 2).mean()"
    assert finding["next_action"].startswith("Make loss_fn (broadcast.py:10) cheaper")
