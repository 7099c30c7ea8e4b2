"""Where a loop counter's loop is: its ``for`` statement in the source.

The progress sampler (nsadiag.probes.sampler) sees an integer local rise between samples;
this module answers, from the function's source, which ``for`` statement counts it
(``for_loop``) and whether that statement iterates over a ``range`` (then the running
loop's iterator, read by nsadiag.probes.framemem, tells where it ends: ``for t in
range(S)`` with ``S == 2048`` ends at 2048, so a reading of ``t = 1407`` is 1,407 of 2,048).
The source is only parsed, never evaluated: nothing of the user's runs on the sampler's
thread.

``loop_location(loop)`` names a loop of the sampled profile (nsadiag.probes.profile) by the
FILE:LINE of its ``for`` statement, as reports show it.
"""

from __future__ import annotations

import ast
import functools
import linecache
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LoopSource:
    """The ``for`` statement that counts a variable: its line, and the ``range`` call's
    end expression (None when the loop is not over a ``range`` or the end is implicit)."""

    line: int
    end: ast.expr | None
    start: ast.expr | None


def _loops_by_function(tree: ast.AST) -> dict[str, list[ast.For]]:
    """Every function's ``for`` statements, by the function's name (one walk of the tree:
    its functions, then each function's body)."""
    found: dict[str, list[ast.For]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, []).extend(
                inner for inner in ast.walk(node) if isinstance(inner, ast.For))
    return found


def _match(nodes: list[ast.For], variable: str) -> LoopSource | None:
    for node in nodes:
        target = node.target
        names = [target] if isinstance(target, ast.Name) else \
            list(target.elts) if isinstance(target, ast.Tuple) else []
        if not any(isinstance(name, ast.Name) and name.id == variable for name in names):
            continue
        call = node.iter
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and \
                call.func.id == "range" and isinstance(target, ast.Name) and \
                1 <= len(call.args) <= 3 and not call.keywords:
            start = call.args[0] if len(call.args) > 1 else None
            end = call.args[0] if len(call.args) == 1 else call.args[1]
            return LoopSource(node.lineno, end, start)
        return LoopSource(node.lineno, None, None)
    return None


def find_for(source: str | ast.AST, function: str, variable: str) -> LoopSource | None:
    """The first ``for variable in ...`` (or ``for variable, _ in enumerate(...)``) inside a
    function named ``function`` of ``source`` (text or its parsed tree); None when there
    is none."""
    tree = ast.parse(source) if isinstance(source, str) else source
    return _match(_loops_by_function(tree).get(function, []), variable)


@functools.lru_cache(maxsize=32)
def _loops_of_file(file: str) -> dict[str, list[ast.For]] | None:
    source = "".join(linecache.getlines(file))
    if not source:
        return None
    try:
        return _loops_by_function(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError):
        return None


@functools.lru_cache(maxsize=256)
def for_loop(file: str, function: str, variable: str) -> LoopSource | None:
    """``find_for`` on ``file``'s source (the file parsed and indexed once, each answer
    cached: the sampler asks while it holds the GIL); None when unreadable or not found."""
    loops = _loops_of_file(file)
    return _match(loops.get(function, []), variable) if loops is not None else None


def loop_location(loop: dict[str, Any]) -> str:
    """FILE:LINE of a profile loop's ``for`` statement (the line it was first read at
    when the source is unreadable), the file relative to the working directory when it
    lies below it."""
    file = str(loop.get("file") or function_and_file(loop["where"])[1])
    line = loop.get("for_line") or loop["where"].rsplit(":", 1)[1].rstrip(")")
    path = Path(file)
    try:
        shown = str(path.relative_to(Path.cwd())) if path.is_absolute() else file
    except ValueError:
        shown = path.name
    return f"{shown}:{line}"


def function_and_file(where: str) -> tuple[str, str]:
    """("forward", "model.py") of a profile's "forward (model.py:42)"."""
    function, _, rest = where.partition(" (")
    return function, rest.rsplit(":", 1)[0]
