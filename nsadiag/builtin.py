"""The built-in NSA model, imported only for the built-in target and NSA-specific probes.

NSA projects often name their own package ``nsa``. When such a package comes first on
sys.path, ``import nsa`` gives the user's package, not nsa-diag's: nsadiag then must not
import ``nsa`` for a foreign target at all, must not take the user's classes for its own
(a user's ``nsa.layer.NSAAttention`` is not ours), and must say so in one line when the
built-in target is asked for.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

OWN_NSA = Path(__file__).resolve().parent.parent / "nsa"
"""Where nsa-diag's own ``nsa`` package lies: beside ``nsadiag`` (a checkout, an editable
or a regular install alike)."""


def nsa_location() -> Path | None:
    """The directory of the ``nsa`` package Python would import, None when there is none;
    the package's code does not run."""
    try:
        spec = importlib.util.find_spec("nsa")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return Path(spec.origin).parent if spec and spec.origin else None
    return Path(list(spec.submodule_search_locations)[0])


def builtin_nsa_available() -> bool:
    """Whether ``import nsa`` gives nsa-diag's own package."""
    location = nsa_location()
    return location is not None and location.resolve() == OWN_NSA


def require_builtin_nsa() -> None:
    """ValueError, one line, when ``import nsa`` would not give nsa-diag's own package."""
    if builtin_nsa_available():
        return
    location = nsa_location()
    found = f"the package `nsa` found first on sys.path is {location}" if location else \
        "no package `nsa` can be imported"
    raise ValueError(f"target nsa: {found}, not nsa-diag's built-in model ({OWN_NSA}); "
                     f"diagnose your own model with --target pkg.module:factory")


def nsa_attention_class() -> type | None:
    """nsa-diag's NSAAttention class, None when ``nsa`` is not ours (then no module of any
    model is one of ours)."""
    if not builtin_nsa_available():
        return None
    from nsa.layer import NSAAttention

    return NSAAttention
