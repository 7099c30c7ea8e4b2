"""The package's layering, read from the source: command modules never import each other,
the report renderers import only the report package's shared modules, nothing below the
command line imports it, and no module imports another's private names."""

import ast
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "nsadiag"
RENDERERS = ("sweep", "seq", "ddp", "check", "triage", "memory", "trace", "stacks", "run")


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in a file, function-level imports included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return found


def test_command_modules_never_import_each_other():
    for path in (PACKAGE / "commands").glob("*.py"):
        for module, _ in imports(path):
            assert not module.startswith("nsadiag.commands"), (path.name, module)


def test_report_renderers_import_no_other_renderer():
    for name in RENDERERS:
        for module, _ in imports(PACKAGE / "report" / f"{name}.py"):
            others = {f"nsadiag.report.{r}" for r in RENDERERS if r != name}
            assert module not in others, (name, module)


def test_only_the_command_line_imports_the_command_line():
    for path in PACKAGE.rglob("*.py"):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        for module, _ in imports(path):
            assert not module.startswith("nsadiag.cli"), (path, module)


def test_no_module_imports_another_modules_private_names():
    for path in PACKAGE.rglob("*.py"):
        for module, names in imports(path):
            if module.startswith("nsadiag"):
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                assert not private, (path, module, private)


DECISIONS = ("nsadiag.triage.engine", "nsadiag.verdict", "nsadiag.compare")
"""Where verdicts, the triage's stages and regressions are decided."""
DECIDING_NAMES = {"analyse", "first_failure", "is_failure", "decide", "hot_frame",
                  "user_frame", "culprit_of", "reproduces", "compare_rows"}


def test_the_report_package_only_formats_what_findings_decided():
    for path in (PACKAGE / "report").glob("*.py"):
        for module, names in imports(path):
            assert not module.startswith(DECISIONS), (path.name, module)
            assert not DECIDING_NAMES & set(names), (path.name, module, names)
