"""TraceResult: a trace run's trace-result.json, parsed once where it is read.

trace-result.json is what ``nsadiag.commands.trace`` measured over one traced training
step: the module spans of the timeline, the gradient anomalies (parameters without a
gradient, gradients accumulated more than once, backward passes that never finished), the
untraced and traced step times and the tracer's overhead, and where the trace files are.
``TraceResult.from_dict`` checks the type of every field; ``to_dict`` writes the object back
as it was stored (the report's summary.json copies it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class TraceResult:
    """One `nsadiag trace` measurement (nsadiag.commands.trace documents each field)."""

    timeline: tuple[Mapping[str, Any], ...]
    """The longest spans, each {"module", "phase", "start_us", "duration_us", ...}."""
    unused_parameters: tuple[str, ...]
    repeated_gradients: Mapping[str, int]
    unfinished_backward: tuple[str, ...]
    step_s_traced: float
    step_s_untraced: float
    step_s_traced_all: tuple[float, ...] | None
    step_s_untraced_all: tuple[float, ...] | None
    overhead_pct: float
    events: int
    trace_json: str
    profiler_trace: str | None
    target: str | None

    @classmethod
    def from_dict(cls, data: Any) -> TraceResult:
        """trace-result.json's object; KeyError or TypeError naming what is missing or of
        the wrong type."""
        if not isinstance(data, dict):
            raise TypeError(f"trace-result.json: not an object but {type(data).__name__}")
        for name, (kinds, nullable) in _TYPES.items():
            value = data.get(name) if nullable else data[name]
            if (value is None and not nullable) or (value is not None and (
                    not isinstance(value, kinds) or isinstance(value, bool))):
                raise TypeError(f"trace-result.json: {name} is a {type(value).__name__}")
        if not all(isinstance(span, dict) for span in data["timeline"]):
            raise TypeError("trace-result.json: a timeline span is not an object")
        values = {name: data.get(name) for name in _TYPES}
        return cls(**{name: tuple(value) if isinstance(value, list) else value
                      for name, value in values.items()})

    def to_dict(self) -> dict[str, Any]:
        """trace-result.json's object, as it was stored."""
        return {f.name: list(getattr(self, f.name)) if isinstance(getattr(self, f.name), tuple)
                else getattr(self, f.name) for f in fields(self)}


_NUMBER = (int, float)
_TYPES: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "timeline": (list, False), "unused_parameters": (list, False),
    "repeated_gradients": (dict, False), "unfinished_backward": (list, False),
    "step_s_traced": (_NUMBER, False), "step_s_untraced": (_NUMBER, False),
    "step_s_traced_all": (list, True), "step_s_untraced_all": (list, True),
    "overhead_pct": (_NUMBER, False), "events": (int, False), "trace_json": (str, False),
    "profiler_trace": (str, True), "target": (str, True)}
"""Each field's JSON types and whether it may be null."""
