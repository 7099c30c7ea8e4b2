"""The user's source as a record carries it: what ``capture(data)`` keeps of every
FILE:LINE of the user's own code a record names, called where the record is made (on the
machine that ran the program, whose files these are), and the ``SourceFile`` it is kept as.

``capture`` reads each file once (a regular file of at most MAX_FILE_BYTES that parses as
Python; a frame named "/proc/self/environ" or "/dev/zero" is never read) and keeps each
named line, the loops that hold it and the ``if`` it sits under, with their headers, and of
those loops' bodies only the lines a finding reads. nsadiag.finding.source answers a
finding's lookups from it. A file that cannot be read or parsed gives None, never an error.
"""

from __future__ import annotations

import ast
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsadiag import runfiles
from nsadiag.evidence import StackFrame
from nsadiag.probes.frames import own_code

LOOPS = (ast.For, ast.AsyncFor, ast.While)
WINDOW = 0
"""Lines kept on each side of a line a record names: none. A report shows the named line,
the loop's header and the condition, each kept; a neighbour would be shared with every
bundle for nothing (a key hard-coded two lines above a raise would travel with it)."""
MAX_FILE_BYTES = 2 * 2**20
"""A source file larger than this is not read (no user module is; a generated one may be)."""
MAX_FILES = 64
MAX_PLACES = 512
"""At most this many files, and FILE:LINE places, are captured for one record."""
MAX_LINE_CHARS = 400
MAX_NODES = 200_000
"""How much of a record ``capture`` walks looking for places (its events are many)."""
MAX_TEXT_CHARS = 2**20
"""How much of one string (a traceback, a dump) is searched for frames."""

FRAME_LINE = re.compile(r'File "(?P<file>[^"\n]+)", line (?P<line>\d+)')
"""A frame of a Python traceback or a faulthandler dump."""
WHERE = re.compile(r"^(?P<file>[^\n]+):(?P<line>\d+) in \S+$")
"""An ERROR verdict's ``where`` fact: "/path/model.py:21 in backward"."""
PROFILE_WHERE = re.compile(r"^\S.* \((?P<name>[^()/]+):(?P<line>\d+)\)$")
"""A profile loop's ``where``: "forward (model.py:42)" (the file's name only)."""
HOST_READ = re.compile(r"\.(?:item|tolist|cpu|numpy)\(\)")
"""A call that copies a tensor's value to the host: a device sync on a GPU, a Python
object per element on any device."""
APPEND = re.compile(r"^\s*([\w.]+)\.(?:append|extend|add)\((.+)\)\s*(?:#.*)?$")
"""A line that adds to a container (what keeps a step's tensors alive when it outlives
the loop)."""
DUMP_NAME = "faulthandler.txt"
MAX_DUMP_BYTES = 8 * 2**20


HOOK_REGISTRATION = re.compile(r"^register(?:_forward|_full_backward|_backward)?(?:_pre)?_hook$")
KEPT_VALUE = re.compile(r"\.(?:detach|item|tolist|cpu|numpy)\(|\bfloat\(|\bint\(")


def hook_appends(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, container, hook) of every ``container.append(x)`` in a function registered
    as a hook (``m.register_forward_hook(f)``, ``register_forward_hook(make(name))`` with
    ``make`` returning ``f``, a tensor's ``register_hook``) where ``x`` is made of what the
    hook was given (its parameters) and is not reduced to a value or detached: each call
    then keeps that tensor, with its autograd graph, in the container."""
    functions: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(node.name, []).append(node)
    registered: list[ast.AST] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and
                HOOK_REGISTRATION.match(node.func.attr) and node.args):
            continue
        given = node.args[0]
        if isinstance(given, ast.Lambda):
            registered.append(given)
        elif isinstance(given, ast.Name):
            registered += functions.get(given.id, [])
        elif isinstance(given, ast.Call) and isinstance(given.func, ast.Name):
            for factory in functions.get(given.func.id, []):  # returns the hook it defines
                returned = {n.value.id for n in ast.walk(factory)
                            if isinstance(n, ast.Return) and isinstance(n.value, ast.Name)}
                registered += [f for name in returned for f in functions.get(name, [])]
    found = []
    for hook in registered:
        params = {a.arg for a in hook.args.args}  # type: ignore[attr-defined]
        name = getattr(hook, "name", "<lambda>")
        for call in ast.walk(hook):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and
                    call.func.attr == "append" and call.args):
                continue
            value = call.args[0]
            text = ast.unparse(value)
            if {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} & params and \
                    not KEPT_VALUE.search(text):
                found.append((call.lineno, ast.unparse(call.func.value), name))
    return sorted(set(found))


@dataclass
class SourceFile:
    """What is known of one source file: how it is shown, its lines (all, or a window),
    its loops (first, last, the names its ``for`` target or ``while`` test reads) and its
    ``if`` statements (line, first and last line of the body)."""

    shown: str
    lines: dict[int, str]
    loops: list[tuple[int, int, frozenset[str]]] = field(default_factory=list)
    ifs: list[tuple[int, int, int]] = field(default_factory=list)
    # (line, container, hook function) of each append, in a function registered as a module
    # or tensor hook, of what the hook was given (``hook_appends``): memory a hook keeps
    hooks: list[tuple[int, str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, shown: str, text: str) -> SourceFile | None:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        lines = {n: code[:MAX_LINE_CHARS] for n, code in enumerate(text.splitlines(), 1)}
        loops, ifs = [], []
        for node in ast.walk(tree):
            if isinstance(node, LOOPS):
                read = node.target if isinstance(node, (ast.For, ast.AsyncFor)) else node.test
                names = frozenset(n.id for n in ast.walk(read) if isinstance(n, ast.Name))
                loops.append((node.lineno, node.end_lineno or node.lineno, names))
            elif isinstance(node, ast.If) and node.body:
                ifs.append((node.lineno, node.body[0].lineno,
                            node.body[-1].end_lineno or node.body[-1].lineno))
        return cls(shown, lines, loops, ifs, hook_appends(tree))

    def window(self, places: Iterable[int]) -> SourceFile:
        """What a record keeps of the file for lines ``places``: the loops holding them or
        starting on them, the ``if`` whose body holds them, and WINDOW lines around each
        of them and each of those headers; of those loops' bodies, only the lines a
        finding reads (``body_lines``)."""
        places = set(places)
        loops = [loop for loop in self.loops
                 if any(loop[0] <= p <= loop[1] for p in places)]
        ifs = [i for i in self.ifs if any(i[0] < p and i[1] <= p <= i[2] for p in places)]
        keep: set[int] = set()
        for line in places | {loop[0] for loop in loops} | {i[0] for i in ifs}:
            keep.update(range(line - WINDOW, line + WINDOW + 1))
        for first, last, _ in loops:
            keep.update(self.body_lines(first, last))
        keep.update(line for line, _, _ in self.hooks)  # a hook's append: one line each
        return SourceFile(self.shown, {n: self.lines[n] for n in sorted(keep)
                                       if n in self.lines}, loops, ifs, list(self.hooks))

    def body_lines(self, first: int, last: int) -> set[int]:
        """The lines of the loop body ``first``-``last`` that a finding reads
        (nsadiag.finding.culprit): a host read (a per-iteration sync), a line that adds to
        a container, and an assignment that makes such a container anew. No other line:
        a secret written beside them stays out of the record."""
        body = {n: self.lines.get(n, "") for n in range(first + 1, last + 1)}
        found = {n for n, code in body.items() if HOST_READ.search(code.split("#")[0])}
        containers = set()
        for n, code in body.items():
            match = APPEND.match(code)
            if match:
                found.add(n)
                containers.add(match[1])
        for container in containers:
            made = re.compile(rf"^\s*{re.escape(container)}\s*=")
            found.update(n for n, code in body.items() if made.match(code))
        return found

    def to_dict(self) -> dict[str, Any]:
        stored = {"shown": self.shown,
                  "lines": {str(n): code for n, code in self.lines.items()},
                  "loops": [[first, last, sorted(names)] for first, last, names in self.loops],
                  "ifs": [list(i) for i in self.ifs]}
        if self.hooks:  # only where there are: records without hooks stay as they were
            stored["hooks"] = [list(h) for h in self.hooks]
        return stored

    @classmethod
    def from_dict(cls, data: Any) -> SourceFile | None:
        """A stored file, None when it is not the shape ``to_dict`` writes."""
        try:
            lines = {int(n): str(code)[:MAX_LINE_CHARS]
                     for n, code in dict(data["lines"]).items()}
            loops = [(int(a), int(b), frozenset(str(n) for n in names))
                     for a, b, names in data.get("loops") or []]
            ifs = [(int(a), int(b), int(c)) for a, b, c in data.get("ifs") or []]
            hooks = [(int(a), str(b), str(c)) for a, b, c in data.get("hooks") or []]
            return cls(str(data["shown"]), lines, loops, ifs, hooks)
        except (KeyError, TypeError, ValueError):
            return None


def _display_path(path: str) -> str:
    """How a finding shows a file: its path from the top of its package
    ("repro/per_token_loop.py"), or the file's name when it is no package's (a script)."""
    file = Path(path)
    parts = [file.name]
    parent = file.parent
    while (parent / "__init__.py").exists() and parent != parent.parent:
        parts.insert(0, parent.name)
        parent = parent.parent
    return "/".join(parts)


def read_source(path: str) -> SourceFile | None:
    """The file at ``path`` of this machine, whole: None unless it is a regular file of at
    most MAX_FILE_BYTES that parses as Python (a frame named "/proc/self/environ" or
    "/dev/zero" is not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not 0 < info.st_size <= MAX_FILE_BYTES:
            return None  # /proc files say 0 bytes and hold more
        data = os.read(fd, MAX_FILE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return SourceFile.parse(_display_path(path), data.decode(errors="replace"))


def _places(data: Any, texts: Iterable[str] = ()) -> list[tuple[str, int]]:
    """Every FILE:LINE of the user's own code (nsadiag.probes.frames.own_code: the only
    lines a finding blames) ``data`` names (frames as {"file", "line"}, traceback and dump
    text, ``where`` facts), then in ``texts``; profile loops that name a file only by its
    name are resolved among the files named elsewhere."""
    found: dict[tuple[str, int], None] = {}
    by_name: list[tuple[str, int]] = []

    def add(file: str, line: int) -> None:
        if len(found) < MAX_PLACES and line > 0 and own_code(StackFrame("", file, line)):
            found[(file, line)] = None

    def scan(text: str) -> None:
        text = text[:MAX_TEXT_CHARS]
        for match in FRAME_LINE.finditer(text):
            add(match["file"], int(match["line"]))
        match = WHERE.match(text) if len(text) < 4096 else None
        if match:
            add(match["file"], int(match["line"]))
        match = PROFILE_WHERE.match(text) if len(text) < 4096 else None
        if match:
            by_name.append((match["name"], int(match["line"])))

    stack, seen = [data], 0
    while stack and seen < MAX_NODES:
        value = stack.pop()
        seen += 1
        if isinstance(value, dict):
            file, line = value.get("file"), value.get("line")
            if isinstance(file, str) and isinstance(line, int) and not isinstance(line, bool):
                add(file, line)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            scan(value)
    for text in texts:
        scan(text)
    files = {file for file, _ in found}
    for name, line in by_name:
        for file in files:
            if Path(file).name == name:
                add(file, line)
    return list(found)


def capture(data: Any, directory: Path | None = None) -> dict[str, Any]:
    """What a record keeps of the source it names (see the module docstring): {"files":
    {path: SourceFile.to_dict()}}, read from this machine's files now. ``directory``: the
    trial's directory, whose faulthandler dumps name frames too."""
    dumps = []
    for dump in runfiles.find(directory, DUMP_NAME) if directory is not None else []:
        text = runfiles.read_bytes(dump, MAX_DUMP_BYTES, DUMP_NAME)
        if text:
            dumps.append(text.decode(errors="replace"))
    places: dict[str, list[int]] = {}
    for file, line in _places(data, dumps):
        places.setdefault(file, []).append(line)
    files = {}
    for file, lines in list(places.items())[:MAX_FILES]:
        whole = read_source(file)
        if whole is not None:
            files[file] = whole.window(lines).to_dict()
    return {"files": files}
