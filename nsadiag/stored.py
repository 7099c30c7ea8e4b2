"""Reading the optional fields of a stored JSON object, with their types checked.

A parser at the disk boundary (a ``from_dict``) reads a field a stored object may lack or
hold as null with ``optional``: it gets the value or None, and a value of another JSON type
is a TypeError naming the field, raised where the file is read (nsadiag.rundir.parse_stored
turns it into one RecordError line), never met later by a renderer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NUMBER = (int, float)


def optional(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...]) -> Any:
    """``data[key]`` when it is set, None when it is absent or null; TypeError when it is
    of another type than ``kinds`` (a JSON true or false is a bool, never a number)."""
    value = data[key] if key in data else None
    if value is None:
        return None
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        names = " or ".join(kind.__name__ for kind in allowed)
        raise TypeError(f"{key}: must be {names}, got {type(value).__name__}")
    return value
