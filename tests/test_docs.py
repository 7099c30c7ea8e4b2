"""The README is a front door and docs/ holds the rest: every relative link in them leads to a
file (and heading) that exists, and a newcomer meets the set-up commands, `nsadiag run` and
where the installed `nsadiag` is within the first screenful."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

README_MAX_LINES = 200
FIRST_RUN_WITHIN = 40       # the first `nsadiag run` command
REACH_NSADIAG_WITHIN = 60   # how to reach the installed command

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link or heading inside one is only text)."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def relative_links(path: Path) -> list[str]:
    links = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for match in _LINK.finditer(_INLINE_CODE.sub("", line)):
            target = match.group(1)
            if not _SCHEME.match(target):
                links.append(target)
    return links


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file, or heading within it, does not exist."""
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{path.name}: {target} (no such file)")
        elif anchor and (dest.is_dir() or anchor not in anchors(dest)):
            broken.append(f"{path.name}: {target} (no heading #{anchor})")
    return broken


def doc_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def first_line_with(lines: list[str], pattern: str) -> int | None:
    for number, line in enumerate(lines, start=1):
        if re.search(pattern, line):
            return number
    return None


def test_every_relative_link_resolves():
    pages = [README, *doc_pages()]
    assert sum(len(relative_links(p)) for p in pages) > len(pages)  # the pages do link
    broken = [b for page in pages for b in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "there.md").write_text("# A `code` heading's title\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a-code-headings-title) [ok](there.md#twice-1) [ok](#here)\n"
        "[gone](missing.md) [no heading](there.md#nowhere) [web](https://example.org/x)\n"
        "`[in code](missing-too.md)`\n\n# Here\n\n```\n[in a fence](missing-three.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md: missing.md (no such file)",
        "page.md: there.md#nowhere (no heading #nowhere)",
    ]


def test_docs_holds_the_rest():
    assert len(doc_pages()) >= 3
    linked = {Path(t.partition("#")[0]).name for t in relative_links(README)}
    unlinked = [p.name for p in doc_pages() if p.name not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    commands = [line.split("#")[0].strip() for line in lines if line.startswith("make ")]
    assert commands[:2] == ["make demo", "make test"]
    first_run = first_line_with(lines, r"nsadiag run ")
    assert first_run is not None and first_run <= FIRST_RUN_WITHIN, first_run
    reach = first_line_with(lines, r"\.venv/bin/nsadiag|make install-tool")
    assert reach is not None and reach <= REACH_NSADIAG_WITHIN, reach
