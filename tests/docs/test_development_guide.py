"""docs/development.md walks the five changes, its index of decisions is the folder of records,
and e2e.md's table of scenarios is the folder of scenarios."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "development.md"
DECISIONS = ROOT / "docs" / "decisions"
FIVE_CHANGES = (
    "Add a GPU health check",
    "Add a placement policy",
    "Add a config field (or a flag)",
    "Add a role",
    "Add an e2e scenario",
)


def _section(text: str, heading: str) -> str:
    """The body under ``heading`` up to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{len(level)}}} ", body, maxsplit=1)[0]


@pytest.mark.parametrize("change", FIVE_CHANGES)
def test_the_guide_walks_each_change_through_files_generators_and_tests(change: str) -> None:
    body = _section(GUIDE.read_text(encoding="utf-8"), f"### {change}")
    assert re.search(r"^1\. ", body, flags=re.M), f"{change}: no numbered list of files"
    assert "src/kubegpu/" in body or "e2e/" in body, f"{change}: names no file"
    assert "Tests that guard it" in body, f"{change}: says no test that guards it"


def test_the_index_of_decisions_is_the_folder_of_records() -> None:
    index = _section(GUIDE.read_text(encoding="utf-8"), "## Design decisions")
    listed = set(re.findall(r"\]\(decisions/([^)]+)\)", index))
    records = {p.name for p in DECISIONS.glob("*.md")}
    assert listed == records, (sorted(records - listed), sorted(listed - records))
    numbers = sorted(name[:4] for name in records)
    assert numbers == [f"{n:04d}" for n in range(1, len(numbers) + 1)], numbers


@pytest.mark.parametrize("record", sorted(DECISIONS.glob("*.md")), ids=lambda p: p.name)
def test_each_decision_record_has_context_decision_consequences_and_its_sources(
    record: Path,
) -> None:
    text = record.read_text(encoding="utf-8")
    assert text.startswith(f"# {record.name[:4]}. "), "the title starts with the record's number"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings == ["Context", "Decision", "Consequences"], headings
    assert re.search(r"\]\(\.\./[^)]+\.md", text), "links to no page that describes it"


def test_e2e_md_lists_every_scenario_module_and_only_those() -> None:
    page = (ROOT / "docs" / "e2e.md").read_text(encoding="utf-8")
    table = _section(page, "## The scenarios (`e2e/tests`, marker `e2e`)")
    listed = set(re.findall(r"^\| `(test_\w+\.py)` \|", table, flags=re.M))
    modules = {p.name for p in (ROOT / "e2e" / "tests").glob("test_*.py")}
    assert listed == modules, (sorted(modules - listed), sorted(listed - modules))
