"""RunMeta: a run directory's run.json, parsed once where it is read.

run.json names the run's kind (``command_name``) and holds its argv and environment; a
sweep's also labels its trials (isolate-branch: "all branches" / "<branch> only") and names
the branch, and a memory or trace run keeps its base spec. ``RunMeta.from_dict`` checks the
type of every field the renderers read (RecordError, one line, naming it); the renderers
read the attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nsadiag.envinfo import EnvReport
from nsadiag.recordspec import RecordSpec
from nsadiag.rundir import RecordError

FIELDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "command_name": (str, "a string"), "argv": (list, "a list"), "branch": (str, "a string"),
    "env": (dict, "an object"), "spec": (dict, "an object"), "labels": (dict, "an object"),
    "pid": (int, "an integer"), "duration_s": ((int, float), "a number"),
    "ranks": (bool, "true or false")}
"""The run.json fields the renderers read, with the JSON type each must have when set."""


@dataclass(frozen=True)
class RunMeta:
    """What run.json says of a run (each field None or empty when it does not say).

    command_name  the command that made the run (nsadiag.report.summary.KINDS)
    argv          its command line, as typed
    branch        the branch isolate-branch measured alone
    env           the environment the run was made in (None: not recorded)
    spec          the base trial spec (memory, trace)
    labels        {trial directory name: label} of a sweep's trials
    pid           the process an attach watched (and, with ``ranks``, the ranks under it)
    duration_s    how long an attach watched it
    """

    command_name: str | None = None
    argv: tuple[str, ...] = ()
    branch: str | None = None
    env: EnvReport | None = None
    spec: RecordSpec | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    pid: int | None = None
    duration_s: float | None = None
    ranks: bool = False

    @classmethod
    def from_dict(cls, data: Any) -> RunMeta:
        """run.json's object; RecordError (one line) when it is not an object or a field the
        renderers read has the wrong type."""
        if not isinstance(data, dict):
            raise RecordError("run.json: not a JSON object")
        for name, (kind, said) in FIELDS.items():
            value = data.get(name)
            if value is not None and (not isinstance(value, kind) or
                                      (isinstance(value, bool) and kind is not bool)):
                raise RecordError(f"run.json: {name} must be {said}, got "
                                  f"{type(data[name]).__name__}")
        try:
            spec = RecordSpec.from_dict(data["spec"]) if data.get("spec") else None
            env = EnvReport.from_dict(data["env"]) if data.get("env") else None
        except TypeError as err:
            raise RecordError(f"run.json: {err}") from None
        labels = data.get("labels") or {}
        if not all(isinstance(label, str) for label in labels.values()):
            raise RecordError("run.json: labels must name each trial by a string")
        return cls(command_name=data.get("command_name"),
                   argv=tuple(str(word) for word in data.get("argv") or ()),
                   branch=data.get("branch"), env=env, spec=spec,
                   labels=dict(labels), pid=data.get("pid"), duration_s=data.get("duration_s"),
                   ranks=bool(data.get("ranks")))

    def attached(self) -> RunMeta:
        """Self, when it names what an attach watched (its pid and for how long);
        RecordError otherwise."""
        if self.pid is None or self.duration_s is None:
            raise RecordError("run.json: an attach run names its pid and duration_s")
        return self

    def label_of(self, trial: str) -> str:
        """A trial's label: the one run.json gives it, else the command's name."""
        return self.labels.get(trial) or self.command_name or "sweep-layers"
