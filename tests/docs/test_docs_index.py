"""The docs index lists every document, and the links in the docs we own lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
OWNED = ("README.md", "architecture.md", "configuration.md", "troubleshooting.md")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lower case, punctuation but ``-``/``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # '#' lines in code are not headings
    return {github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_index_lists_every_document() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    listed = set(_LINK.findall(index))
    documents = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert documents <= listed, f"docs/README.md does not list {sorted(documents - listed)}"


@pytest.mark.parametrize("name", OWNED)
def test_relative_links_lead_to_a_file_and_heading_that_exist(name: str) -> None:
    source = DOCS / name
    broken = []
    for target in _LINK.findall(source.read_text(encoding="utf-8")):
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
