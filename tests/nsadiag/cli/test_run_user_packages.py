"""`nsadiag run` watches a user's command without changing what it imports: a project with
its own top-level ``nsa`` (a namespace package, as the public NSA project has, or a regular
one) and ``repro``, run from its checkout as ``PYTHONPATH=. python scripts/train.py``,
prints exactly what it prints without nsadiag; and a script run by another virtualenv's
python, one where nsadiag is not installed, is watched too."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import block_enters, nsadiag

TRAIN = textwrap.dedent("""
    import sys

    import torch
    from torch import nn

    import nsa.model
    import repro

    print("nsa.model from", nsa.model.__file__)
    print("repro says", repro.WHO)
    print("sys.path", sys.path)
    print("imported", sorted(m for m in sys.modules if m.split(".")[0] in ("nsa", "repro")))
    torch.manual_seed(0)
    model = nsa.model.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    """)

MODEL = textwrap.dedent("""
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x).tanh()
            return x
    """)


def _project(root: Path, namespace_nsa: bool) -> Path:
    """The user's checkout: nsa/ (no __init__.py when `namespace_nsa`), repro/, scripts/."""
    files = {"nsa/model.py": MODEL, "repro/__init__.py": "WHO = 'the user'\n",
             "scripts/train.py": TRAIN}
    if not namespace_nsa:
        files["nsa/__init__.py"] = ""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _watched(out: Path, command: list[str], cwd: Path, env: dict[str, str]
             ) -> subprocess.CompletedProcess:
    return nsadiag("run", "--out", str(out), "--", *command, cwd=cwd, env=env)


@pytest.mark.parametrize("namespace_nsa", [True, False], ids=["namespace-nsa", "regular-nsa"])
def test_a_users_own_nsa_and_repro_are_what_the_watched_script_imports(tmp_path, namespace_nsa):
    project = _project(tmp_path / "project", namespace_nsa)
    env = {**os.environ, "PYTHONPATH": "."}
    command = [sys.executable, "scripts/train.py"]
    plain = _run(command, project, env)
    assert plain.returncode == 0, plain.stderr
    assert f"nsa.model from {project / 'nsa' / 'model.py'}" in plain.stdout
    watched = _watched(tmp_path / "run", command, project, env)
    assert watched.returncode == 0, watched.stderr
    shown = plain.stdout.splitlines()
    assert watched.stdout.splitlines()[:len(shown)] == shown  # then nsadiag's headline
    assert (tmp_path / "run" / "stdout.txt").read_text() == plain.stdout
    assert block_enters(tmp_path / "run") == 3 * 2  # it was watched: 3 steps, 2 blocks


def _torch_distributions() -> set[str]:
    """torch's distribution and those it needs (its requirements without extras)."""
    wanted, seen = ["torch"], set()
    while wanted:
        name = wanted.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(key)
        for requirement in dist.requires or []:
            if "extra ==" not in requirement:
                wanted.append(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
    return seen


@pytest.fixture(scope="module")
def torch_only_venv(tmp_path_factory) -> Path:
    """A virtualenv with torch and what torch needs, and nothing of nsa-diag's: its
    site-packages links to this environment's copies of those distributions only."""
    venv = tmp_path_factory.mktemp("other-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = Path(subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path("
         "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip())
    tops = importlib.metadata.packages_distributions()
    keep = _torch_distributions()
    here = Path(importlib.metadata.distribution("torch").locate_file(""))
    for top, dists in tops.items():
        if any(re.sub(r"[-_.]+", "-", d).lower() in keep for d in dists):
            for source in (here / top, here / f"{top}.py"):
                if source.exists() and not (site / source.name).exists():
                    (site / source.name).symlink_to(source)
    return venv


def test_a_script_run_by_another_virtualenv_without_nsadiag_is_watched(tmp_path,
                                                                      torch_only_venv):
    python = str(torch_only_venv / "bin" / "python")
    probe = _run([python, "-c", "import torch, importlib.util; "
                  "print(importlib.util.find_spec('nsadiag'), importlib.util.find_spec('rich'))"],
                 tmp_path, dict(os.environ))
    assert probe.returncode == 0 and probe.stdout.split() == ["None", "None"], probe.stderr
    project = _project(tmp_path / "project", namespace_nsa=True)
    env = {**os.environ, "PYTHONPATH": "."}
    plain = _run([python, "scripts/train.py"], project, env)
    assert plain.returncode == 0, plain.stderr
    watched = _watched(tmp_path / "run", [python, "scripts/train.py"], project, env)
    assert watched.returncode == 0, watched.stderr
    assert (tmp_path / "run" / "stdout.txt").read_text() == plain.stdout
    assert "not watched" not in watched.stderr
    assert block_enters(tmp_path / "run") == 3 * 2
