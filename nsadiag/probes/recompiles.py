"""What torch.compile compiled inside a watched process, and why it compiled again.

Dynamo keeps a record of every compile it finished (``torch._dynamo.utils
.get_compilation_metrics()``: the function, its file and first line, the compile id and,
for a recompile, the first guard that failed, e.g. "tensor 'ids' size mismatch at index 1.
expected 97, actual 113"). ``CompileWatch.poll()`` reads the records that are new since its
last reading and emits one "compile" heartbeat event for each. It reads only: no logging
setting is changed (the user's stderr stays as it is without nsadiag), no hook is
registered in Dynamo, nothing runs inside traced code; and it never imports Dynamo itself
(the program's own import decides whether it is loaded).

Dynamo keeps its last 64 records; a reading every COMPILE_POLL_S misses none unless a
process finishes more than 64 compiles in that time (a compile takes a second or more).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

COMPILE_POLL_S = 1.0
GUARD_TEXT_CHARS = 300
"""The guard-failure text kept per compile: its first line names the guard and the values
(Dynamo's verbose mode adds the guard's source, which the report does not quote)."""


def compile_fields(record: Any) -> dict[str, Any] | None:
    """The fields of one compile record a verdict uses; None for a record of something
    that was not a frame's compile (a runtime event such as a backward's lazy compile)."""
    if getattr(record, "is_runtime", False) or not getattr(record, "co_name", None):
        return None
    reason = getattr(record, "recompile_reason", None)
    return {"compile_id": getattr(record, "compile_id", None), "function": record.co_name,
            "file": getattr(record, "co_filename", None),
            "line": getattr(record, "co_firstlineno", None),
            "recompile_reason": str(reason).strip().splitlines()[0][:GUARD_TEXT_CHARS]
            if reason else None}


class CompileWatch:
    """Emits each compile record Dynamo finished since the last ``poll`` once."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]):
        self.emit = emit
        self._seen: set[tuple[Any, Any]] = set()

    def poll(self) -> int:
        """Emit the new records; how many there were (0 while Dynamo is not loaded)."""
        utils = sys.modules.get("torch._dynamo.utils")
        read = getattr(utils, "get_compilation_metrics", None)
        if read is None:
            return 0
        try:
            records = read()
        except RuntimeError:  # the deque changed under the copy: read again next time
            return 0
        new = 0
        for record in records:
            key = (getattr(record, "compile_id", None), getattr(record, "start_time", None))
            if key in self._seen:
                continue
            self._seen.add(key)
            fields = compile_fields(record)
            if fields is not None:
                self.emit(fields)
                new += 1
        return new
