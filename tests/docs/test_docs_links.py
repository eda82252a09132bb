"""The README and the docs pages link to each other, to code and to pictures by relative paths: every
such link must name a file that exists (and, with a #fragment into a Markdown page, a heading there),
so a page moved or renamed cannot leave a newcomer at a dead link."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "bench" / "results").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"```.*?```", re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text)))
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text()))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_that_exists(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#") and not target[1:]:
            continue  # http(s), mailto: not ours to check here
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif fragment and dest.suffix == ".md" and fragment.lower() not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: dead links {broken}"


def test_the_pages_do_link_somewhere():
    """The check above reads real links (a pattern that matched nothing would pass every page)."""
    assert sum(len(links(p)) for p in PAGES) > 30
    assert any("docs/" in t for t in links(ROOT / "README.md"))
