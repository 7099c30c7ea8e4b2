"""Put first on PYTHONPATH by `nsadiag run`: every Python process of the user's command
imports it at start-up, so each is watched (nsadiag.harness.watched) with no edit to the
user's code. Without NSADIAG_RUN_DIR it does nothing.

The process must import what it would without nsadiag, so this file's directory holds
nothing else and leaves ``sys.path`` again as soon as it has run: no package of nsa-diag's
(``nsa``, ``repro``) ever comes before or beside the user's own. nsadiag's hook code is
loaded from the tree this file lies in, under its own name ``nsadiag`` only (a finder that
answers for that one name), so it also runs in an interpreter where nsadiag is not
installed (nsadiag in a tool environment of its own, the command run by another
virtualenv's python): it needs the standard library and, once the user's code imports it,
the user's torch. A sitecustomize this one shadows (a virtualenv's, a distribution's)
still runs, first.
"""

import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NSADIAG = os.path.dirname(os.path.dirname(HERE))
"""The nsadiag package this file belongs to (nsadiag/harness/inject/ -> nsadiag/)."""


def _off_path(entry: str) -> bool:
    return os.path.abspath(entry or os.curdir) != HERE


def _chain() -> None:
    """Run the sitecustomize that would have run without this directory on the path."""
    path = [p for p in sys.path if _off_path(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


class NsadiagFinder:
    """A meta path finder for the one top-level name ``nsadiag``, from NSADIAG; its
    submodules are found through the package's ``__path__`` as usual."""

    @classmethod
    def find_spec(cls, name: str, path: object = None, target: object = None) -> object:
        if name != "nsadiag":
            return None
        return importlib.util.spec_from_file_location(
            "nsadiag", os.path.join(NSADIAG, "__init__.py"),
            submodule_search_locations=[NSADIAG])


def _watch() -> None:
    run_dir = os.environ.get("NSADIAG_RUN_DIR")
    if not run_dir:
        return
    try:
        sys.meta_path.insert(0, NsadiagFinder)
        from pathlib import Path

        from nsadiag.harness.watched import start

        start(Path(run_dir))
    except Exception as exc:  # the user's command must run, watched or not
        print(f"nsadiag run: this process is not watched ({type(exc).__name__}: {exc})",
              file=sys.stderr)


try:
    _chain()
finally:
    sys.path[:] = [p for p in sys.path if _off_path(p)]
    _watch()
