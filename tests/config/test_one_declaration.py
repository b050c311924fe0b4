"""A config field's text is declared once: as the ``description`` of its field in the model.

``--help`` (``kubegpu.cli.config_options``) and docs/configuration.md (``kubegpu.docgen``) both
read it from there. What these tests refuse are the ways a second copy crept in before: a
table of notes in the generator, a ``#`` comment above a field (the generator used to read
those), and the same text again in a click option's help or anywhere else in the package.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from kubegpu.config import extender as extender_config
from kubegpu.config import model as agent_config
from kubegpu.config.extender import ExtenderConfig
from kubegpu.config.model import AgentConfig

SRC = Path(agent_config.__file__).resolve().parents[1]  # src/kubegpu


def _models(root: type[BaseModel]) -> Iterator[type[BaseModel]]:
    seen: set[type[BaseModel]] = set()
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        yield model
        for info in model.model_fields.values():
            inner = info.annotation
            if typing.get_origin(inner) is list:
                (inner,) = typing.get_args(inner)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                todo.append(inner)


_ALL: set[type[BaseModel]] = {*_models(AgentConfig), ExtenderConfig}
MODELS = sorted(_ALL, key=lambda m: m.__name__)


def _normal(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def test_every_config_field_has_its_description_in_its_model() -> None:
    missing = []
    for model in MODELS:
        for name, info in model.model_fields.items():
            inner = info.annotation
            holds_model = isinstance(inner, type) and issubclass(inner, BaseModel)
            # A field holding a model may leave its text to that model's docstring.
            described = (info.description or "").strip() or (holds_model and inner.__doc__)
            if not described:
                missing.append(f"{model.__name__}.{name}")
    assert not missing, f"fields without Field(description=...): {missing}"


def _comments_beside_fields(model: type) -> list[str]:
    source = textwrap.dedent(inspect.getsource(model))
    lines = source.splitlines()
    found = []
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        above = lines[item.lineno - 2].strip() if item.lineno >= 2 else ""
        inline = lines[item.lineno - 1].partition("  # ")[2]
        if above.startswith("#") or inline:
            found.append(f"{model.__name__}.{item.target.id}")
    return found


def test_no_config_field_is_described_by_a_comment_beside_it() -> None:
    # A comment there reads as the field's documentation, yet neither --help nor the reference
    # shows it. A maintainer's note about the code goes inside the Field(...) call.
    beside = [f for model in MODELS for f in _comments_beside_fields(model)]
    assert not beside, f"comments beside fields (use Field(description=...)): {beside}"


def _strings(source: str) -> list[str]:
    """Every string literal of a module (implicit concatenations joined), normalised."""
    return [
        _normal(node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def declarations(text: str, strings: dict[str, list[str]]) -> list[str]:
    """The modules whose string literals hold ``text``, once per literal."""
    wanted = _normal(text)
    return [name for name, found in strings.items() for s in found if wanted in s]


# Shorter texts ("Address to listen on.") may well be said of another command's own option.
SHORTEST = 30


def test_no_field_description_is_declared_a_second_time() -> None:
    # testing/ holds stand-ins (a fake API server) whose options are settings of their own.
    strings = {
        str(path.relative_to(SRC)): _strings(path.read_text(encoding="utf-8"))
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).parts[0] != "testing"
    }
    twice = []
    for model in MODELS:
        for name, info in model.model_fields.items():
            if info.description and len(_normal(info.description)) >= SHORTEST:
                where = declarations(info.description, strings)
                if len(where) > 1:  # none: made from data (the policy registry's names)
                    twice.append(f"{model.__name__}.{name}: {where}")
    assert not twice, "field texts declared more than once:\n" + "\n".join(twice)


def test_a_planted_second_declaration_is_found() -> None:
    text = AgentConfig.model_fields["gpu_allocation"].description
    assert text is not None
    strings = {"config/model.py": _strings(inspect.getsource(agent_config))}
    assert declarations(text, strings) == ["config/model.py"]
    # The same words as a click help elsewhere, split over lines as the code would write it.
    half = len(text) // 2
    planted = f"import click\nclick.option('--x', help={text[:half]!r}\n    {text[half:]!r})\n"
    strings["cli/other.py"] = _strings(planted)
    assert declarations(text, strings) == ["config/model.py", "cli/other.py"]


def test_the_extender_and_agent_models_are_the_ones_scanned() -> None:
    modules = {inspect.getmodule(m) for m in MODELS}
    assert modules == {agent_config, extender_config}
