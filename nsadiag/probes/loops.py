"""Where a loop counter's loop is and how far it goes: its ``for`` statement in the source,
and the end of its ``range`` read from the running frame's locals.

The progress sampler (nsadiag.probes.sampler) sees an integer local rise between samples;
this module answers, from the function's source, which ``for`` statement counts it
(``for_line``) and, from the frame's locals at a sample, where that loop ends
(``loop_end``): ``for t in range(S)`` with ``S == 2048`` ends at 2048, so a reading of
``t = 1407`` is 1,407 of 2,048.

The end is evaluated from a small safe subset of expressions only, so reading it can run
no code of the user's: integer locals and literals, ``+ - * //``, ``min``/``max``,
``len()`` of a list, tuple, string, dict or range, and a tensor's ``.shape[i]`` or
``.size(i)`` (tensors are recognised by their type's name and module: torch is never
imported here). Anything else gives None.

``loop_location(loop)`` names a loop of the sampled profile (nsadiag.probes.profile) by the
FILE:LINE of its ``for`` statement, as reports show it.
"""

from __future__ import annotations

import ast
import functools
import linecache
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv}
_SIZED = (list, tuple, str, dict, range)


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


def _is_tensor(value: Any) -> bool:
    kind = type(value)
    return kind.__module__.startswith("torch") and kind.__name__ in ("Tensor", "Parameter")


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def evaluate(node: ast.expr | None, names: dict[str, Any]) -> int | None:
    """The integer value of ``node`` over ``names`` (a frame's locals) in the safe subset
    of the module docstring; None for anything else."""
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return _int(node.value)
    if isinstance(node, ast.Name):
        return _int(names.get(node.id))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = evaluate(node.left, names), evaluate(node.right, names)
        if left is None or right is None or (isinstance(node.op, ast.FloorDiv) and not right):
            return None
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and \
            node.value.attr == "shape":
        tensor, index = _tensor(node.value.value, names), _constant_index(node.slice)
        return _dim(tensor, index)
    if isinstance(node, ast.Call):
        return _call(node, names)
    return None


def _tensor(node: ast.expr, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        value = names.get(node.id)
        return value if _is_tensor(value) else None
    return None


def _constant_index(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant):
        return _int(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and \
            isinstance(node.operand, ast.Constant) and _int(node.operand.value) is not None:
        return -node.operand.value
    return None


def _dim(tensor: Any, index: int | None) -> int | None:
    if tensor is None or index is None:
        return None
    shape = tuple(tensor.shape)
    return int(shape[index]) if -len(shape) <= index < len(shape) else None


def _call(node: ast.Call, names: dict[str, Any]) -> int | None:
    func = node.func
    if isinstance(func, ast.Name) and func.id == "len" and len(node.args) == 1 and \
            isinstance(node.args[0], ast.Name):
        value = names.get(node.args[0].id)
        return len(value) if isinstance(value, _SIZED) else None
    if isinstance(func, ast.Name) and func.id in ("min", "max") and node.args:
        values = [evaluate(arg, names) for arg in node.args]
        if any(value is None for value in values):
            return None
        return (min if func.id == "min" else max)(values)
    if isinstance(func, ast.Attribute) and func.attr == "size" and len(node.args) == 1:
        return _dim(_tensor(func.value, names), _constant_index(node.args[0]))
    return None


def loop_end(file: str, function: str, variable: str, names: dict[str, Any]) -> int | None:
    """Where the ``range`` loop counting ``variable`` in ``function`` ends (exclusive),
    evaluated over ``names``; None when it cannot be told safely."""
    found = for_loop(file, function, variable)
    return evaluate(found.end, names) if found is not None else None


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
