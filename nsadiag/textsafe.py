"""Text from a record, a child's output or argv, made safe to show: no control characters.

A received run directory's record can hold anything in an exception message, a command
word or a quoted stderr line, and a terminal obeys what it is sent: cursor-up and
erase-line (``ESC [1A ESC [2K``) turn a red ERROR line into a green "OK", OSC 52 sets the
clipboard, OSC 0 the window title, a bare carriage return overwrites the line. ``clean``
removes every escape sequence whole (CSI, OSC, DCS/SOS/PM/APC strings up to their
terminator, two-byte ESC sequences, and their 8-bit C1 forms) and then every remaining
control character (C0 but newline and tab, DEL, C1) and the Unicode bidirectional
overrides that reorder what is shown. Each pattern scans forward over a character class
that excludes its own terminator, so the cost is linear in the text.

Only nsadiag's renderings go through here (report.md, summary.json, what the command line
prints about a run); a watched program's own output reaches the terminal as it wrote it.
"""

from __future__ import annotations

import re
from typing import Any

_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"  # CSI: cursor, erase, colour
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    # ^ OSC (title, clipboard, hyperlinks), DCS, SOS, PM, APC: a string up to BEL or ST
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"  # any other ESC sequence (and a lone ESC)
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0 but tab and newline, DEL, C1, and the bidirectional embeddings and isolates."""
_LINE_BREAKS = re.compile(r"[\n\t]")


def clean(text: str) -> str:
    """``text`` without escape sequences and control characters; newlines and tabs kept
    (a CRLF line ending becomes a newline)."""
    if text.isprintable():  # the common case: nothing to remove (newline is not printable)
        return text
    return _CONTROLS.sub("", _SEQUENCES.sub("", text.replace("\r\n", "\n")))


def clean_line(text: str) -> str:
    """``clean`` for one line of output: newlines and tabs become spaces too."""
    return _LINE_BREAKS.sub(" ", clean(text))


def clean_obj(value: Any) -> Any:
    """A JSON value with every string in it (keys too) ``clean``ed."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean_obj(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_obj(v) for v in value]
    return value


_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")
_SCRIPT_LINK = re.compile(r"\]\(\s*(?:javascript|vbscript|data)\s*:", re.IGNORECASE)


def markdown_safe(text: str) -> str:
    """Markdown in which no stored string can act as HTML: outside code spans and fenced
    blocks (where a renderer shows text as it is) every ``<`` that could open a tag
    (``<script>``, ``<img onerror=...>``, an autolink ``<javascript:...>``) is written
    ``&lt;``, shown as the same character, and a link to a ``javascript:``, ``vbscript:``
    or ``data:`` address keeps its text but points nowhere (``#``)."""
    if "<" not in text and "](" not in text:
        return text
    lines, fenced = [], False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            line = _outside_code(line)
        lines.append(line)
    return "\n".join(lines)


def _outside_code(line: str) -> str:
    parts, last = [], 0
    for span in _CODE_SPAN.finditer(line):
        parts += [_escaped(line[last:span.start()]), span.group(0)]
        last = span.end()
    parts.append(_escaped(line[last:]))
    return "".join(parts)


def _escaped(prose: str) -> str:
    return _SCRIPT_LINK.sub("](#", _TAG_OPEN.sub("&lt;", prose))
