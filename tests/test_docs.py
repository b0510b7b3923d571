"""The documentation: the README stays short and every link in it and in docs/ resolves."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md")), ROOT / "src/plasticlm/memory/README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(header: str) -> str:
    """GitHub's anchor of a Markdown header."""
    text = re.sub(r"[^\w\- ]", "", header.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, fence = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def test_readme_is_short_and_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    head = text[: text.index("## ")]
    assert "make demo" in head and "make test" in head


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target} does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: no header #{anchor} in {dest.name}"
