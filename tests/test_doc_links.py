"""Every relative link of README.md and docs/ names a file that exists and, with a `#part`,
a heading of that page (GitHub's anchors: lower case, punctuation dropped, spaces to `-`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.M | re.S)


def anchors(page: Path) -> set[str]:
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose(page.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        base, n = slug, 1
        while slug in found:
            slug, n = f"{base}-{n}", n + 1
        found.add(slug)
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, part = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif part and linked.suffix == ".md" and part not in anchors(linked):
            where = linked.relative_to(REPO) if linked.is_relative_to(REPO) else linked
            broken.append(f"{target}: no heading #{part} in {where}")
    return broken


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    assert not broken_links(page), broken_links(page)


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# B\n\n## The `x` part, first\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#the-x-part-first) [gone](c.md) [bad](b.md#nope) [web](https://x.org/a#b)\n"
                    "```\n[in code](d.md)\n```\n")
    missing_heading = f"b.md#nope: no heading #nope in {(tmp_path / 'b.md').resolve()}"
    assert broken_links(page) == ["c.md: no such file", missing_heading]
