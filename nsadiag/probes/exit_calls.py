"""Where a program that exited with a code and no traceback ended itself: the calls in its
own script that exit with that code, and the last line it printed.

A program that calls ``sys.exit(3)`` leaves no traceback: Python prints nothing for a
SystemExit with a number, so the exit code is all the process says. Its script is read for
calls that give that code as a literal (``sys.exit(3)``, ``exit(3)``, ``quit(3)``,
``os._exit(3)``, ``raise SystemExit(3)``); the last line of its output is what it said
before it went (often the check that failed). Both are read where the run is recorded, on
the machine that ran it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_CALL = re.compile(r"(?<![\w.])(?:sys\.exit|exit|quit|os\._exit|raise\s+SystemExit)"
                       r"\(\s*(\d{1,3})\s*\)")
MAX_SCRIPT_BYTES = 4 * 2**20
MAX_CALLS = 5


@dataclass(frozen=True)
class ExitCall:
    """One call in the script that exits with the code: where, and its line."""

    file: str
    line: int
    code: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "code": self.code}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExitCall:
        return cls(str(data["file"]), int(data["line"]), str(data["code"]))


def exit_calls(script: Path | None, code: int | None) -> list[ExitCall]:
    """The lines of ``script`` that exit with ``code`` (at most MAX_CALLS); none for a code
    of 0, a script that cannot be read, or one larger than MAX_SCRIPT_BYTES."""
    if script is None or not code:
        return []
    try:
        if not script.is_file() or script.stat().st_size > MAX_SCRIPT_BYTES:
            return []
        text = script.read_text(errors="replace")
    except OSError:
        return []
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        match = EXIT_CALL.search(line)
        if match and int(match[1]) == code and not line.lstrip().startswith("#"):
            found.append(ExitCall(str(script), number, line.strip()[:200]))
    return found[:MAX_CALLS]


def script_of(argv: list[str], cwd: Path) -> Path | None:
    """The script a Python process runs, from its ``sys.argv`` (its first word; a path
    relative to the directory it ran in); None for ``-c`` and an interactive one."""
    if not argv or argv[0] in ("", "-c", "-"):
        return None
    path = Path(argv[0])
    return path if path.is_absolute() else cwd / path


def last_line(*texts: str) -> str | None:
    """The last non-empty line among ``texts`` (the tails of stdout, then stderr: the last
    given wins when it has one), at most 200 characters."""
    for text in reversed(texts):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1][:200]
    return None
