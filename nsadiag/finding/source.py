"""The user's source, read where a finding names a line: how to show its file, the code of
a line, the loop around a line, the condition a line sits under.

Everything here reads files through ``linecache`` and parses them with ``ast``; a file
that cannot be read or parsed gives None, never an error (a report re-rendered on another
machine names the line without its code).
"""

from __future__ import annotations

import ast
import functools
import linecache
from pathlib import Path

LOOPS = (ast.For, ast.AsyncFor, ast.While)


def display_path(path: str) -> str:
    """How a finding shows a file: its path from the top of its package
    ("repro/per_token_loop.py"), or the file's name when it is no package's (a script)."""
    file = Path(path)
    parts = [file.name]
    parent = file.parent
    while (parent / "__init__.py").exists() and parent != parent.parent:
        parts.insert(0, parent.name)
        parent = parent.parent
    return "/".join(parts)


def code_at(path: str, line: int) -> str | None:
    """The stripped source of ``line`` of ``path``; None when it cannot be read."""
    return linecache.getline(path, line).strip() or None


@functools.lru_cache(maxsize=64)
def _tree(path: str) -> ast.Module | None:
    source = "".join(linecache.getlines(path))
    if not source:
        return None
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None


def _names(target: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(target) if isinstance(node, ast.Name)}


def _contains(node: ast.AST, line: int) -> bool:
    end = getattr(node, "end_lineno", None) or node.lineno
    return node.lineno <= line <= end


def loop_around(path: str, line: int, variable: str | None = None) -> tuple[int, int] | None:
    """(first, last) line of the innermost loop that holds ``line``: with ``variable``,
    the ``for`` whose target names it (or a ``while`` whose test reads it), else any
    loop; None when no such loop is found or the source cannot be parsed."""
    tree = _tree(path)
    if tree is None:
        return None
    found: ast.AST | None = None
    for node in ast.walk(tree):
        if not isinstance(node, LOOPS) or not _contains(node, line):
            continue
        if variable is not None:
            names = _names(node.target) if isinstance(node, (ast.For, ast.AsyncFor)) else \
                _names(node.test)
            if variable not in names:
                continue
        if found is None or node.lineno > found.lineno:
            found = node
    return (found.lineno, found.end_lineno or found.lineno) if found is not None else None


def loop_at(path: str, line: int) -> tuple[int, int] | None:
    """(first, last) line of the loop whose header is ``line`` (a ``while`` a process
    spins in), None when ``line`` starts no loop."""
    tree = _tree(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, LOOPS) and node.lineno == line:
            return node.lineno, node.end_lineno or node.lineno
    return None


def condition_above(path: str, line: int) -> tuple[int, str] | None:
    """(line, code) of the innermost ``if`` whose body holds ``line`` (the condition a
    collective was issued under), None when there is none."""
    tree = _tree(path)
    if tree is None:
        return None
    found: ast.If | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.lineno < line and \
                any(_contains(child, line) for child in node.body):
            if found is None or node.lineno > found.lineno:
                found = node
    if found is None:
        return None
    return found.lineno, code_at(path, found.lineno) or ""
