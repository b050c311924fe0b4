"""Every module, class, function, file, flag and resource name the documents give exists.

The scan and its rules are in ``tests/docs/references.py``; config keys are checked by
``test_config_keys_in_docs.py`` and links by ``test_docs_index.py``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.docs.references import (
    BUILT_FAMILIES,
    DOCUMENTS,
    PACKAGE,
    ROOT,
    UPSTREAM_FLAGS,
    UPSTREAM_RESOURCES,
    broken,
    command_tree,
    references,
    script_flags,
    source_text,
)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_a_document_gives_resolves_in_the_code(document: Path) -> None:
    wrong = [str(ref) for ref in broken([document])]
    assert not wrong, "names that do not resolve:\n" + "\n".join(wrong)


# ---------------------------------------------------------------------------------------------
# The checker itself: a planted wrong name of every kind is caught, its right twin is not.

PLANTED = [
    # (kind, a wrong name in a sentence, its right twin)
    ("python", "`kube.pods.record_decision`", "`kube.binding`"),
    ("python", "`kubegpu.sharing.ledger.Ledgr`", "`kubegpu.sharing.ledger.Ledger`"),
    ("python", "`GpuScheduler.decid`", "`GpuScheduler.decide`"),
    ("python", "`placement.engine.PlacementEngine.nope()`", "`placement.engine.PlacementEngine`"),
    ("python", "`sharing.claim.read_clam(pod, names)`", "`sharing.claim.read_claim(pod, names)`"),
    (
        "python",
        "`python -m kubegpu.docgen.config --write`",
        "`python -m kubegpu.docgen.configuration --write`",
    ),
    ("path", "`src/kubegpu/kubelet/ledger.py`", "`src/kubegpu/sharing/ledger.py`"),
    ("path", "`kubelet/ledger.py`", "`sharing/ledger.py`"),
    ("path", "`deploy/helm/kubegpu/values.yml`", "`deploy/helm/kubegpu/values.yaml`"),
    ("path", "`tests/docs/test_docs_index.py::test_nothing`", "`tests/docs/test_docs_index.py`"),
    ("path", "`e2e/run -k x` with `e2e/tests/test_<n>.yaml`", "`e2e/tests/test_<n>.py`"),
    ("defined", "(`kubelet/shares.py` `Ledger`)", "(`sharing/ledger.py` `Ledger`)"),
    ("flag", "`kubegpu extender --slots-per-card 4`", "`kubegpu extender --policy binpack`"),
    ("flag", "`kubegpu trace arrivals --policy x`", "`kubegpu trace arrivals --seeds 42`"),
    ("flag", "`--no-such-flag`", "`--fake-gpus`"),
    (
        "flag",
        "\n```sh\nkubegpu labels \\\n  --nope\n```\n",
        "\n```sh\nkubegpu labels --once\n```\n",
    ),
    ("resource", "`kubegpu.io/gpu-slot`", "`kubegpu.io/gpu-shared`"),
    ("resource", "the annotation kubegpu.io/gpu-alloc", "the annotation kubegpu.io/gpu-allocation"),
    ("resource", "`volcano.sh/gpu-mem`", "`volcano.sh/gpu-memory`"),
    ("resource", "`gpu.kubegpu.io/healthy`", "`gpu.kubegpu.io/unhealthy`"),
]


@pytest.mark.parametrize(("kind", "wrong", "right"), PLANTED, ids=[p[1] for p in PLANTED])
def test_a_planted_wrong_name_is_caught(tmp_path: Path, kind: str, wrong: str, right: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\nSee {wrong} here.\n", encoding="utf-8")
    found = broken([page])
    assert [ref.kind for ref in found] == [kind], found
    lines = page.read_text(encoding="utf-8").splitlines()
    assert found[0].text in lines[found[0].line - 1]
    page.write_text(f"# A page\n\nSee {right} here.\n", encoding="utf-8")
    assert broken([page]) == []


@pytest.mark.parametrize(
    "text",
    [
        "`sharing.gpuShare.slotsPerCard`",  # a config key: test_config_keys_in_docs.py's
        "`extender.policy`",  # a Helm value
        "`dra.md`, `kubelet.sock`",  # file names
        "`kubectl -n kubegpu logs deploy/kubegpu-scheduler`",  # a Deployment, not a folder
        "`helm install --wait --set x=1`",  # helm's flags
        "`spec.nodeName`",  # Kubernetes' field
    ],
)
def test_what_is_not_a_name_of_ours_is_not_checked_as_one(tmp_path: Path, text: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"See {text} here.\n", encoding="utf-8")
    assert list(references(page)) == []


# ---------------------------------------------------------------------------------------------
# The allow-lists hold only what is needed.


def test_every_allowed_flag_is_someone_elses() -> None:
    ours = set().union(*command_tree().values()) | script_flags()
    assert not UPSTREAM_FLAGS & ours, "allow-listed, yet a flag of ours: drop it from the list"


def test_every_allowed_resource_name_is_not_spelt_in_our_code() -> None:
    spelt = [
        name for name in UPSTREAM_RESOURCES if re.search(rf"{re.escape(name)}\b", source_text())
    ]
    assert not spelt, f"allow-listed, yet in the source: drop them from the list: {spelt}"


def test_every_family_of_built_names_has_its_prefix_in_the_code() -> None:
    assert all(prefix in source_text() for prefix in BUILT_FAMILIES)


# ---------------------------------------------------------------------------------------------
# The README's Layout table and architecture.md's package map follow the tree.


def _first_column(document: Path, heading: str) -> list[str]:
    """The first cells of the first table under ``heading``, backticks removed."""
    text = document.read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(r"\n#{1,6} ", section, maxsplit=1)[0]
    cells = re.findall(r"^\| ?([^|]+?) ?\|", section, flags=re.M)
    return [c.strip("`") for c in cells if not set(c) <= {"-", " "}][1:]  # header row left out


def _tree() -> set[str]:
    """Every package of src/kubegpu and every module directly in it, as the tables write them."""
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.name for p in PACKAGE.glob("*.py")} - {"__init__.py", "__main__.py"}
    return packages | modules


def test_the_readme_layout_names_every_package_and_module_and_only_those() -> None:
    rows = _first_column(ROOT / "README.md", "## Layout")
    listed = {r.removeprefix("src/kubegpu/") for r in rows if r.startswith("src/kubegpu/")}
    assert listed == _tree(), (
        f"missing from the Layout table: {sorted(_tree() - listed)}; "
        f"listed but not in src/kubegpu: {sorted(listed - _tree())}"
    )
    others = [r for r in rows if not r.startswith("src/kubegpu/")]
    assert all((ROOT / r).exists() for r in others), others


def test_the_architecture_package_map_names_every_package() -> None:
    rows = set(_first_column(ROOT / "docs" / "architecture.md", "## Package map"))
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert rows == packages, (sorted(packages - rows), sorted(rows - packages))


def test_the_import_rule_names_every_contract_and_only_those() -> None:
    """architecture.md's list of contracts is pyproject.toml's, by name."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        contracts = tomllib.load(handle)["tool"]["importlinter"]["contracts"]
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rule = page.split("\n## The import rule\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^- \*\*(.+?)\*\*:", rule, flags=re.M))
    assert named == {c["name"] for c in contracts}
