"""RecordSpec: the spec a trial record carries, parsed once where the record is read.

A record's spec is one of three JSON objects: a TrialSpec (nsadiag.spec, keys sorted), the
command of `nsadiag run` (command, its limits and the subject the verdict names it by), or a
block under ``nsadiag.watch()`` (the same, with its kind and pid). ``RecordSpec.from_dict``
checks the type of every field it names and keeps the keys in the order they were stored, so
``to_dict`` writes the same JSON object back (a key it does not name is kept as read: a
record of an older nsadiag still reads, and still writes as it was). Readers ask the
attributes; an absent field reads as None, as ``dict.get`` did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

_NUMBER = (int, float)


@dataclass(frozen=True)
class RecordSpec:
    """What one trial ran. TrialSpec's fields (nsadiag.spec.TrialSpec documents each) or a
    user's command:

    command      the argv of `nsadiag run`, or of the script a watched block runs in
    subject      what the verdict calls it ("the command", "the watched block")
    kind         "watch" for a block under ``nsadiag.watch()``; None for the other specs
    pid          the process of a watched block
    deadline_s   the run's wall-time limit (None: none)
    """

    command: tuple[str, ...] | None = None
    subject: str | None = None
    kind: str | None = None
    pid: int | None = None
    deadline_s: float | None = None
    target: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    n_layers: int | None = None
    seq_len: int | None = None
    batch: int | None = None
    dtype: str | None = None
    grad_ckpt: bool | None = None
    branches: tuple[str, ...] | None = None
    backend: str | None = None
    device: str | None = None
    steps: int | None = None
    seed: int | None = None
    stall_timeout_s: float | None = None
    budget_s: float | None = None
    startup_grace_s: float | None = None
    memory_cap_bytes: int | None = None
    out_dir: str | None = None
    keys: tuple[str, ...] = ()
    """The stored keys, in their stored order (what ``to_dict`` writes)."""
    unnamed: tuple[tuple[str, Any], ...] = ()
    """Stored keys this nsadiag does not name, with their values as read."""

    @property
    def is_command(self) -> bool:
        """A user's command or watched block (`nsadiag run`, ``watch()``), not a TrialSpec."""
        return "command" in self.keys or "subject" in self.keys

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordSpec:
        """The spec of a stored record; TypeError naming the first field of the wrong type."""
        if not isinstance(data, Mapping):
            raise TypeError(f"spec: must be an object, got {type(data).__name__}")
        named = {f.name for f in fields(cls)} - {"keys", "unnamed"}
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in named:
                continue
            _check(key, value)
            values[key] = tuple(value) if key in ("command", "branches") and value is not None \
                else value
        unnamed = tuple((k, v) for k, v in data.items() if k not in named)
        return cls(**values, keys=tuple(data), unnamed=unnamed)

    def to_dict(self) -> dict[str, Any]:
        """The spec's JSON object, as it was stored."""
        others = dict(self.unnamed)
        data: dict[str, Any] = {}
        for key in self.keys:
            value = others[key] if key in others else getattr(self, key)
            data[key] = list(value) if isinstance(value, tuple) else value
        return data


_TYPES: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "command": ((list,), False, "a list of strings"),
    "subject": ((str,), True, "a string"),
    "kind": ((str,), True, "a string"),
    "pid": ((int,), True, "an integer"),
    "deadline_s": (_NUMBER, True, "a number"),
    "target": ((str,), False, "a string"),
    "overrides": ((dict,), False, "an object"),
    "n_layers": ((int,), True, "an integer"),
    "seq_len": ((int,), False, "an integer"),
    "batch": ((int,), False, "an integer"),
    "dtype": ((str,), False, "a string"),
    "grad_ckpt": ((bool,), False, "true or false"),
    "branches": ((list,), True, "a list of strings"),
    "backend": ((str,), True, "a string"),
    "device": ((str,), False, "a string"),
    "steps": ((int,), False, "an integer"),
    "seed": ((int,), False, "an integer"),
    "stall_timeout_s": (_NUMBER, False, "a number"),
    "budget_s": (_NUMBER, False, "a number"),
    "startup_grace_s": (_NUMBER, False, "a number"),
    "memory_cap_bytes": ((int,), True, "an integer"),
    "out_dir": ((str,), False, "a string"),
}
"""Each named field's JSON types, whether it may be null, and what it must be."""


def _check(key: str, value: Any) -> None:
    kinds, nullable, said = _TYPES[key]
    if value is None and nullable:
        return
    wrong = not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
    if not wrong and key in ("command", "branches"):
        wrong = not all(isinstance(item, str) for item in value)
    if wrong:
        raise TypeError(f"spec.{key}: must be {said}"
                        f"{' or null' if nullable else ''}, got {type(value).__name__}")
