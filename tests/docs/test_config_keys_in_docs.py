"""Every node agent config key the documents name exists, spelt as the config file spells it.

A key is any `dotted.name` in backticks whose first part is a field of some config model, in
either spelling (``gpuShare`` or ``gpu_share``): ``gpu_share.slots_per_card`` is caught as well
as ``sharing.gpuShare.slotsPerCrad``. It must be a whole path from the top of the file
(``sharing.gpuShare.slotsPerCard``) or the tail of one (``mps.restartMaxS``, said inside the
section about ``sharing.gpuShare``). Python module paths (``sharing.resources.gpu_request``)
are not config keys and are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from kubegpu.config.model import AgentConfig

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGE = ROOT / "src" / "kubegpu"
_DOTTED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def config_paths(
    model: type[BaseModel] = AgentConfig, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every key path of the config file, in its spelling (the aliases)."""
    for name, info in model.model_fields.items():
        path = (*prefix, info.alias or name)
        yield path
        inner = _model_in(info.annotation)
        if inner is not None:
            yield from config_paths(inner, path)


def field_names(model: type[BaseModel] = AgentConfig) -> Iterator[str]:
    """Every field name in both spellings, at any depth."""
    for name, info in model.model_fields.items():
        yield name
        yield info.alias or name
        inner = _model_in(info.annotation)
        if inner is not None:
            yield from field_names(inner)


PATHS = {".".join(p) for p in config_paths()}
NAMES = set(field_names())


def is_module_path(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):  # a package and a module in it, at least
        base = PACKAGE.joinpath(*parts[:cut])
        if base.is_dir() or base.with_suffix(".py").is_file():
            return True
    return False


def named_keys(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for dotted in _DOTTED.findall(line):
            if dotted.split(".")[0] in NAMES and not is_module_path(dotted):
                yield number, dotted


def is_config_key(dotted: str) -> bool:
    return any(p == dotted or p.endswith(f".{dotted}") for p in PATHS)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_key_a_document_names_exists(document: Path) -> None:
    wrong = [f"line {n}: `{key}`" for n, key in named_keys(document) if not is_config_key(key)]
    assert not wrong, f"{document.name} names config keys that do not exist: {wrong}"


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("`sharing.gpuShare.slotsPerCard`", True),
        ("`mps.restartMaxS`", True),
        ("`gpu_share.slots_per_card`", False),
        ("`sharing.gpuShare.slotsPerCrad`", False),
        ("`sharing.resources.gpu_request`", None),  # a Python module path: not a key
        ("`spec.nodeName`", None),  # not the agent's config at all
    ],
)
def test_the_scan_tells_keys_from_other_dotted_names(
    tmp_path: Path, text: str, valid: bool | None
) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"Set {text} here.\n")
    found = [key for _, key in named_keys(page)]
    if valid is None:
        assert found == []
    else:
        assert [is_config_key(key) for key in found] == [valid]
