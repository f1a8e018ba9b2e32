"""The manual as a reader meets it: every relative link of README.md, SECURITY.md and
docs/*.md leads to a file that exists (and, into a Markdown file, to a heading it has);
the README keeps the two set-up commands of the contract and the benchmark's newest
table, the same as docs/benchmark.md's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def manual() -> list[Path]:
    return [PROJECT / "README.md", PROJECT / "SECURITY.md",
            *sorted((PROJECT / "docs").glob("*.md"))]


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, where a link or a heading is one."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, its punctuation dropped, spaces as
    hyphens (inline code and link targets reduced to their text first)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(path.read_text()):
        if m := HEADING.match(line):
            base = slug(m.group(2))
            name, n = base, 0
            while name in found:  # GitHub numbers a repeated heading's anchor
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def links(path: Path) -> list[str]:
    return [m.group(1) for line in prose(path.read_text()) for m in LINK.finditer(line)]


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("path", manual(), ids=lambda p: str(p.relative_to(PROJECT)))
def test_every_relative_link_of_the_manual_resolves(path):
    assert links(path) or path.name != "README.md"  # the README links out: it is read
    assert broken_links(path) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# There\n\n## A heading: with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading-with-code) [file](there.md)\n"
                    "[gone](missing.md) [no anchor](there.md#nowhere)\n"
                    "```\n[in code](ignored.md)\n```\n[web](https://example.com/x)\n")
    assert broken_links(page) == ["missing.md: no such file", "there.md#nowhere: no such heading"]


def section(text: str, title: str) -> str:
    """A `##` section of a Markdown file, up to the next heading of its level."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_readme_sets_up_with_the_contracts_two_commands():
    setup = section((PROJECT / "README.md").read_text(), "Set-up")
    commands = [line.split("#")[0].strip() for line in setup.splitlines()
                if line.startswith("make ")]
    assert commands == ["make run", "make test"]


def test_the_readmes_benchmark_table_is_docs_benchmarks_newest():
    def table(text: str) -> list[str]:
        rows = [line for line in text.splitlines() if line.startswith("| case |")
                or line.startswith("| checkpoint-small |")]
        start = text.splitlines().index(rows[0])
        lines = text.splitlines()[start:]
        return lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]

    readme = table(section((PROJECT / "README.md").read_text(), "Benchmark"))
    assert readme[0].startswith("| case | worldline |") and len(readme) > 10
    assert readme == table((PROJECT / "docs" / "benchmark.md").read_text())


def test_the_readme_stays_a_few_hundred_lines():
    assert len((PROJECT / "README.md").read_text().splitlines()) <= 400
