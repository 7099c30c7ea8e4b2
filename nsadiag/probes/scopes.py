"""What a stopped thread's own code holds and loops in, read from its source: the ``with``
blocks around the line it stands at (the locks it holds) and the loop it is in.

``thread_scopes(sample)`` reads, for every frame of the user's own code in every thread of
a stack sample, the source file's syntax tree and returns a ``Scope``
(nsadiag.probes.waits) per frame: the
``with`` items that enclose the frame's line (their text and line: ``with stats_lock:`` at
52 means the thread holds ``stats_lock`` there, since it entered that block and has not
left it) and the innermost ``while``/``for`` loop around it (its header's text and line).
A file that cannot be read or parsed gives no scope. Read by the watcher at a stall, never
inside the watched process.
"""

from __future__ import annotations

import ast
from functools import lru_cache

from nsadiag.evidence import StackSample
from nsadiag.probes.frames import own_code
from nsadiag.waitfacts import Scope


@lru_cache(maxsize=64)
def _tree(path: str) -> tuple[ast.Module, str] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        return ast.parse(source), source
    except (OSError, SyntaxError, ValueError):
        return None


def _header(source: str, node: ast.While | ast.For) -> str:
    if isinstance(node, ast.While):
        return f"while {ast.get_source_segment(source, node.test) or '...'}:"
    target = ast.get_source_segment(source, node.target) or "..."
    return f"for {target} in {ast.get_source_segment(source, node.iter) or '...'}:"


def enclosing(path: str, line: int) -> tuple[tuple[tuple[str, int], ...],
                                            tuple[str, int] | None] | None:
    """(with items, innermost loop) around ``line`` of ``path`` within its function;
    None when the file cannot be parsed."""
    parsed = _tree(path)
    if parsed is None:
        return None
    tree, source = parsed
    withs: list[tuple[str, int]] = []
    loop: tuple[str, int] | None = None

    def inside(node: ast.AST) -> bool:
        end = getattr(node, "end_lineno", None)
        return end is not None and node.lineno <= line <= end

    def walk(node: ast.AST) -> None:
        nonlocal loop
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.stmt) or not inside(child):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                withs.clear()  # a block of an outer function is not held by this frame
                loop = None
            elif isinstance(child, (ast.With, ast.AsyncWith)) and child.body and \
                    child.body[0].lineno <= line:
                withs.extend((ast.get_source_segment(source, item.context_expr) or "?",
                              child.lineno) for item in child.items)
            elif isinstance(child, (ast.While, ast.For)) and child.body and \
                    child.body[0].lineno <= line:
                loop = (_header(source, child), child.lineno)
            walk(child)

    walk(tree)
    return tuple(withs), loop


def thread_scopes(sample: StackSample) -> tuple[Scope, ...]:
    """The Scope of every frame of the user's own code in ``sample``, innermost first per
    thread."""
    found = []
    for thread in sample.threads:
        for frame in thread.frames:
            if not own_code(frame):
                continue
            read = enclosing(frame.file, frame.line)
            if read is not None:
                found.append(Scope(thread.thread_id, frame.file, frame.function, frame.line,
                                   *read))
    return tuple(found)
