"""The docs index lists every document, and every relative link in the documents leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Every Markdown document: the README, docs/ and the decision records under it.
DOCUMENTS = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """The targets of the Markdown links in ``text``; code (a regex's ``](...)``) is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return _LINK.findall(re.sub(r"`[^`\n]*`", "", text))


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation but ``-``/``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # '#' lines in code are not headings
    return {github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_index_lists_every_document() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    listed = set(links(index))
    documents = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert documents <= listed, f"docs/README.md does not list {sorted(documents - listed)}"


@pytest.mark.parametrize("source", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_a_file_and_heading_that_exist(source: Path) -> None:
    broken = []
    for target in links(source.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        path = (source.parent / file_part).resolve() if file_part else source
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("`flags.plugin.deviceIDStrategy`", "flagsplugindeviceidstrategy"),
        ("GPU backend (NVML and the fake)", "gpu-backend-nvml-and-the-fake"),
        ("`kubegpu inspect` / `kubectl gpu inspect`", "kubegpu-inspect--kubectl-gpu-inspect"),
    ],
)
def test_anchors_follow_githubs_rule(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor
