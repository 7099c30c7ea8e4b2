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
            # a package or a module of it; nsadiag.verdictfacts is data, not a decision
            assert not any(module == decided or module.startswith(decided + ".")
                           for decided in DECISIONS), (path.name, module)
            assert not DECIDING_NAMES & set(names), (path.name, module, names)


def calls(path: Path) -> set[str]:
    """The names a file calls, as written (``Evidence`` for ``Evidence(...)``, ``f`` for
    ``x.f(...)``: the last part)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(func.id if isinstance(func, ast.Name) else
                      func.attr if isinstance(func, ast.Attribute) else "")
    return found


def test_no_command_module_constructs_a_verdict():
    """Verdicts are decided in nsadiag.verdict (and the checks that judge what they
    measured); a command only runs an engine and writes what it decided."""
    for path in (PACKAGE / "commands").glob("*.py"):
        assert "Verdict" not in calls(path), path.name


def test_one_module_builds_a_watched_runs_evidence_and_one_runs_the_capture_loop():
    building = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                if "Evidence" in calls(p)}
    capturing = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if "capture_all" in calls(p)}
    assert building == {"harness/record.py"}
    assert capturing == {"harness/session.py"}
