"""Put first on PYTHONPATH by `nsadiag run`: every Python process of the user's command
imports it at start-up, so each is watched (nsadiag.harness.watched) with no edit to the
user's code. A sitecustomize this one shadows (a virtualenv's, a distribution's) still
runs, first. Without NSADIAG_RUN_DIR it does nothing."""

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    """Run the sitecustomize that would have run without this directory on the path."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _watch() -> None:
    run_dir = os.environ.get("NSADIAG_RUN_DIR")
    if not run_dir:
        return
    try:
        from pathlib import Path

        from nsadiag.harness.watched import start

        start(Path(run_dir))
    except Exception as exc:  # the user's command must run, watched or not
        print(f"nsadiag run: this process is not watched ({type(exc).__name__}: {exc})",
              file=sys.stderr)


try:
    _chain()
finally:
    _watch()
