"""A watched model's copies are the model as it is without nsadiag: `torch.save(model)` (a
pickle of the whole module) works under `nsadiag run` and loads in a Python where nsadiag
is not imported, and a deep copy (an EMA or teacher model) carries none of nsadiag's
hooks, while the user's own hooks go along as they would (nsadiag.harness.uncopied)."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap

import torch
from torch import nn

from nsadiag.harness.uncopied import keep_out_of_copies
from tests.helpers import nsadiag

BLOCKS = textwrap.dedent("""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Linear(8, 8)

        def forward(self, x):
            return x + torch.tanh(self.mlp(x))
    """)
SCRIPT = textwrap.dedent("""
    import copy, sys, torch
    from torch import nn
    from blocks import Block  # a class the pickle names, importable where it is loaded

    model = nn.Sequential(*[Block() for _ in range(3)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        model(torch.randn(2, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}", flush=True)
    torch.save(model, sys.argv[1])
    ema = copy.deepcopy(model)
    print("hooks on the copy:", sum(len(m._forward_pre_hooks) + len(m._forward_hooks)
                                    for m in ema.modules()), flush=True)
    """)


def _user_hook(module, args):
    return None


def test_the_hooks_named_stay_out_of_pickles_and_deep_copies_and_the_users_stay_in():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    ours = [model.register_forward_pre_hook(lambda module, args: None),
            model.register_forward_hook(lambda module, args, output: None, always_call=True)]
    theirs = model.register_forward_pre_hook(_user_hook)
    keep_out_of_copies(model, ours)
    for again in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert list(again._forward_pre_hooks.values()) == [_user_hook]
        assert not again._forward_hooks and not again._forward_hooks_always_called
        assert "__getstate__" not in again.__dict__
        torch.testing.assert_close(again(torch.ones(1, 2)), model(torch.ones(1, 2)))
    # the module itself keeps every hook
    assert len(model._forward_pre_hooks) == 2 and theirs.id in model._forward_pre_hooks


def test_torch_save_of_a_watched_model_works_and_loads_without_nsadiag(tmp_path):
    script, saved = tmp_path / "train.py", tmp_path / "model.pt"
    script.write_text(SCRIPT)
    (tmp_path / "blocks.py").write_text(BLOCKS)
    done = nsadiag("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(script),
                   str(saved), timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK (healthy)" in done.stdout
    assert "hooks on the copy: 0" in done.stdout
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, torch; model = torch.load(sys.argv[1], "
                               "weights_only=False); print(model(torch.ones(1, 8)).shape, "
                               "'nsadiag' in sys.modules)", str(saved)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "torch.Size([1, 8]) False"
