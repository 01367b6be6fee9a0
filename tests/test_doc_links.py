"""Every relative link and #anchor in README.md, benchmarks/README.md and the guide (docs/**/*.md) resolves.

Pages are read as GitHub renders them: a heading's anchor is its text lowercased, spaces turned into '-', and
punctuation other than '-' and '_' dropped; a repeated heading gets '-1', '-2', ... The guide ships in the wheel
and error messages point into it, so a renamed section must take its links with it.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markdown links keep their text, then the punctuation goes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def without_code(text: str) -> str:
    """The page without fenced blocks: a link-shaped string in a code sample is not a link."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    text = without_code(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out: set[str] = set()
    for match in HEADING.finditer(text):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    out.update(HTML_ANCHOR.findall(text))
    return out


def links(page: Path) -> list[str]:
    text = without_code(page.read_text(encoding="utf-8"))
    text = CODE_SPAN.sub("", text)
    return [m.group(1) for m in LINK.finditer(text)]


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """The page's relative links whose file or anchor is missing, as 'target (why)'."""
    out = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not dest.exists():
            out.append(f"{target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
            out.append(f"{target} (no such section in {dest.relative_to(root)})")
    return out


def test_slugs_follow_githubs_rules() -> None:
    assert slug("The kernels switch (`--kernels auto|reference`)") == "the-kernels-switch---kernels-autoreference"
    assert slug("2-core CPU with AVX-512") == "2-core-cpu-with-avx-512"
    assert slug("Shared-prefix training (`--layout shared`)") == "shared-prefix-training---layout-shared"
    assert slug("What's in a [checkpoint](formats.md)?") == "whats-in-a-checkpoint"


def test_the_checker_finds_a_missing_file_and_a_missing_section(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## Part one\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#part-one) [ok](#here) [gone](a.md#part-two) [none](c.md) `[code](d.md)`\n\n## Here\n",
        encoding="utf-8",
    )
    assert broken_links(page, tmp_path) == ["a.md#part-two (no such section in a.md)", "c.md (no such file)"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []
