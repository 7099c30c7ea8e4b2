"""How nsadiag starts a helper process of its own (the reaper, the watch helper): isolated
from the user's current directory.

``python -m MODULE`` puts the current directory first on ``sys.path``, so a ``json.py``,
``select.py`` or ``secrets.py`` where the user typed the command would be imported into
nsadiag's helper (and run there). A helper runs in the directory that holds the nsadiag
package instead, with that directory first on its ``PYTHONPATH``: ``sys.path[0]`` is then
nsadiag's own, and nothing of the user's directory is on the path. Every path handed to a
helper is absolute. ``failure_line`` reads why one did not start, for one true line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory that holds the nsadiag package (a checkout, or site-packages)."""


def helper_popen(module: str, *args: str, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """``subprocess.Popen`` arguments (args, env, cwd) that run ``python -m module args``
    as a helper; ``drop`` names environment variables it must not inherit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [PACKAGE_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                          if p])}
    for name in drop:
        env.pop(name, None)
    return {"args": [sys.executable, "-m", module, *args], "env": env, "cwd": PACKAGE_ROOT}


def failure_line(log: bytes, code: int | None) -> str:
    """One line for a helper that exited with ``code`` before doing its work: the last
    line of what it wrote to stderr (its exception), or its exit status."""
    lines = [line.strip() for line in log.decode(errors="replace").splitlines()
             if line.strip()]
    status = f"exit code {code}" if code is not None and code >= 0 else \
        f"killed by signal {-code}" if code is not None else "no exit status"
    return f"{lines[-1][:300]} ({status})" if lines else status
