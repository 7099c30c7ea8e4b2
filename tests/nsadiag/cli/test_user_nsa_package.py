"""A user's own top-level package named ``nsa`` first on sys.path: nsadiag diagnoses the
user's model without importing (or mistaking the user's classes for) the built-in ``nsa``,
and the built-in target says in one line why it cannot run."""

import json
import os
import textwrap

from tests.helpers import nsadiag

USER_NSA = {
    "nsa/__init__.py": "raise ImportError('the user nsa package breaks on import')\n",
    "usermodel.py": textwrap.dedent("""
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.mlp = nn.Linear(dim, dim)

            def forward(self, x):
                return x + torch.tanh(self.mlp(x))

        class LM(nn.Module):
            def __init__(self, n_layers):
                super().__init__()
                self.embed = nn.Embedding(64, 16)
                self.blocks = nn.ModuleList(Block(16) for _ in range(n_layers))
                self.head = nn.Linear(16, 64)

            def forward(self, ids):
                x = self.embed(ids)
                for block in self.blocks:
                    x = block(x)
                return self.head(x)

        def make(n_layers: int = 2):
            return LM(n_layers)
        """),
}


def _user_tree(tmp_path):
    for name, text in USER_NSA.items():
        path = tmp_path / "user" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "user"


def _beside_user_nsa(tmp_path, *args):
    """nsadiag ARGS run from tmp_path with the user's tree (its own ``nsa``) on PYTHONPATH."""
    return nsadiag(*args, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": str(_user_tree(tmp_path))})


def test_a_foreign_target_is_diagnosed_beside_a_user_package_named_nsa(tmp_path):
    out = tmp_path / "run"
    done = _beside_user_nsa(tmp_path, "sweep-layers", "--target", "usermodel:make",
                            "--layers", "1,2", "--seq-len", "16", "--steps", "2",
                            "--stall-timeout", "30", "--out", str(out))
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = json.loads((out / "summary.json").read_text())
    assert [v["verdict"] for v in summary["verdicts"]] == ["OK", "OK"]


def test_the_built_in_target_says_the_nsa_package_is_not_ours(tmp_path):
    done = _beside_user_nsa(tmp_path, "sweep-layers", "--layers", "1", "--seq-len", "16",
                            "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "the package `nsa` found first on sys.path is" in lines[0]
    assert "--target pkg.module:factory" in lines[0]
