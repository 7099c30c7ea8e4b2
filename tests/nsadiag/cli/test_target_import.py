"""A user's target module is imported only in watched children, under a deadline: a
module that blocks at import gets a stall verdict with the import's stack, one that raises
or calls sys.exit() at import is ERROR naming it, and nsadiag's own process never runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO

HEADER = textwrap.dedent("""
    import os, pathlib
    pathlib.Path(os.environ["IMPORTED_BY"], str(os.getpid())).touch()
""")
MODULES = {
    "raises_at_import": HEADER + 'raise RuntimeError("no GPU config found")\n',
    "exits_at_import": HEADER + "import sys\nsys.exit(3)\n",
    "blocks_at_import": HEADER + textwrap.dedent("""
        import threading
        _registry_lock = threading.Lock()
        _registry_lock.acquire()
        _registry_lock.acquire()  # blocks the import forever
    """),
}
TAIL = textwrap.dedent("""
    from tests.diag_targets import TinyLM

    def make(n_layers: int = 1):
        return TinyLM(n_layers)
""")


def sweep(tmp_path: Path, module: str, *options: str, timeout: float = 400
          ) -> tuple[subprocess.CompletedProcess, set[int]]:
    package = tmp_path / "pkg"
    package.mkdir(exist_ok=True)
    (package / f"{module}.py").write_text(MODULES.get(module, HEADER) + TAIL)
    imported = tmp_path / "imported-by"
    imported.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package), str(REPO)]),
           "IMPORTED_BY": str(imported)}
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "sweep-layers", "--target",
                             f"{module}:make", "--layers", "1", "--seq-len", "16", "--steps",
                             "1", "--out", str(tmp_path / "run"), *options], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=timeout)
    importers = {int(p.name) for p in imported.iterdir()}
    assert proc.pid not in importers, "nsadiag imported the user's module itself"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), importers


def first_trial(tmp_path: Path) -> dict:
    lines = (tmp_path / "run" / "trials.jsonl").read_text().splitlines()
    return json.loads(lines[0])


@pytest.mark.parametrize("module, message", [
    ("raises_at_import", "importing 'raises_at_import' raised RuntimeError: no GPU config "
                         "found"),
    ("exits_at_import", "importing 'exits_at_import' called sys.exit(3)"),
])
def test_an_import_that_raises_or_exits_is_an_error_naming_it(tmp_path, module, message):
    done, importers = sweep(tmp_path, module)
    assert done.returncode == 1, done.stderr  # a failure found: neither 0 nor 3
    assert importers, "no child imported the module"
    verdict = first_trial(tmp_path)["verdict"]
    assert verdict["name"] == "ERROR"
    assert message in verdict["reasons"][0]
    assert "Traceback" not in done.stderr


def test_an_import_that_blocks_is_a_stall_with_the_imports_stack(tmp_path):
    # the start-up grace (8 s here) covers starting up, not a wait: an import blocked on a
    # lock is a stall at the stall timeout
    done, importers = sweep(tmp_path, "blocks_at_import", "--stall-timeout", "3",
                            "--startup-grace", "8")
    assert done.returncode == 1, done.stderr
    assert len(importers) == 2, "the check's child and the trial's child imported it"
    verdict = first_trial(tmp_path)["verdict"]
    assert verdict["name"] == "DEADLOCK", verdict
    assert verdict["facts"]["wait_frame"].startswith("<module> (blocks_at_import.py:")
    assert "_registry_lock.acquire()" in " ".join(verdict["reasons"])
    quiet = float(verdict["reasons"][0].split("no progress for ")[1].split(" s")[0])
    assert 3 <= quiet < 8, verdict["reasons"][0]  # stopped at the stall timeout


def test_a_knob_the_factory_does_not_take_is_one_line_from_a_child(tmp_path):
    done, importers = sweep(tmp_path, "fine", "--set", "width=3")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "factory fine:make does not accept 'width'; it accepts: n_layers" in done.stderr
    assert len(importers) == 1 and not (tmp_path / "run").exists()
