"""Memory kept by a hook: a function registered as a forward hook (directly, or made by a
factory) that appends what it is given keeps every step's tensors; the OOM's line is that
append, not the loop's forward call."""

from __future__ import annotations

import ast
import json
import sys
import textwrap

from nsadiag.sourcelines import hook_appends
from tests.helpers import checkout_env, nsadiag

HOOKED = textwrap.dedent("""
    from collections import defaultdict
    import torch
    from torch import nn
    FEATURES = defaultdict(list)
    GRADS = []
    SEEN = []

    def keep(name):
        def hook(module, inputs, output):
            FEATURES[name].append(output)
        return hook

    def log_grad(grad):
        GRADS.append(grad.norm().item())

    def note(module, inputs, output):
        SEEN.append(output.detach().cpu())

    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
    for name, module in model.named_children():
        module.register_forward_hook(keep(name))
    model[0].register_forward_hook(note)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100000):
        x = torch.randn(512, 256, requires_grad=True)
        x.register_hook(log_grad)
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
""")


def test_only_a_hook_that_keeps_what_it_is_given_is_found():
    assert hook_appends(ast.parse(HOOKED)) == [(11, "FEATURES[name]", "hook")]


def test_an_oom_kept_by_a_forward_hook_blames_the_hooks_append(tmp_path):
    script = tmp_path / "hooked.py"
    script.write_text(HOOKED)
    out = tmp_path / "run"
    done = nsadiag("run", "--out", str(out), "--", "bash", "-c",
                   f"ulimit -v 2200000; exec {sys.executable} {script}", env=checkout_env())
    assert done.returncode == 1, done.stderr
    finding = json.loads((out / "summary.json").read_text())["finding"]
    assert finding["verdict"] == "OOM"
    assert finding["culprit"]["where"] == "hooked.py:11"
    assert finding["culprit"]["retains"] == "FEATURES"
    assert finding["next_action"].startswith("Keep the value, not the tensor, in `FEATURES` "
                                             "at hooked.py:11")
