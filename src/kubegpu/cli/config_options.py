"""Click options made from config model fields, so a setting is declared once: in its model.

An option that sets one field of a config model (the node agent's
:class:`~kubegpu.config.model.AgentConfig`, or the extender's
:class:`~kubegpu.config.extender.ExtenderConfig`) takes from that field its help text (the
field's ``description``, the same text ``docs/configuration.md`` shows), its type (``bool``: a
``--x/--no-x`` pair; ``Literal``: a choice; a number: a range with the field's bounds) and its
default. The command only names the option, the field, and how it reads the value:

* ``from_file=True`` (``kubegpu device-plugin``): the option overrides the config file, so it
  defaults to None ("not given") and ``--help`` shows the model's default as the one that
  applies when the file is silent;
* otherwise the option's default is the field's default, shown by click as usual.

``tests/cli`` checks that every option so made says exactly what its field says.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import annotated_types
import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kubegpu.cli.types import FiniteFloatRange

F = TypeVar("F", bound=Callable[..., Any])


def field_at(model: type[BaseModel], path: str) -> FieldInfo:
    """The field at a YAML path as the reference spells it: aliases, and ``[]`` after a list
    of objects (``flags.plugin.cdiDir``, ``resources.gpus[].pattern``)."""
    current: type[BaseModel] | None = model
    info: FieldInfo | None = None
    for key in path.split("."):
        if current is None:
            raise LookupError(f"{path}: {key!r} is under a field that holds no model")
        name = key.removesuffix("[]")
        info = next(
            (f for attr, f in current.model_fields.items() if name in (f.alias, attr)), None
        )
        if info is None:
            raise LookupError(f"{path}: {current.__name__} has no field {name!r}")
        inner = info.annotation
        if key.endswith("[]") and typing.get_origin(inner) is list:
            (inner,) = typing.get_args(inner)
        current = inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None
    assert info is not None, path
    return info


# How an option's help names the field it sets: "key" leads with the config path (the option
# overrides that key of the file the command reads); "agent" leads with the node agent's
# setting (the option must agree with it); None leaves it out (the option is the setting).
Cite = Literal["key", "agent"] | None


def help_text(info: FieldInfo, path: str, cite: Cite = None) -> str:
    """The field's description as ``--help`` shows it (Markdown's backticks dropped), naming
    the config path as ``cite`` says."""
    if not info.description:
        raise LookupError(f"{path}: the field has no description to show in --help")
    text = " ".join(info.description.replace("`", "").split())
    if cite is None:
        return text
    return f"{path}: {text}" if cite == "key" else f"The node agent's {path}: {text}"


def _literal_values(annotation: object) -> tuple[Any, ...] | None:
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return None


def _bounds(info: FieldInfo) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Ge):
            found["min"] = meta.ge
        elif isinstance(meta, annotated_types.Gt):
            found.update(min=meta.gt, min_open=True)
        elif isinstance(meta, annotated_types.Le):
            found["max"] = meta.le
        elif isinstance(meta, annotated_types.Lt):
            found.update(max=meta.lt, max_open=True)
    return found


def _without_none(annotation: object) -> object:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def option_type(info: FieldInfo) -> tuple[click.ParamType[Any, Any] | None, str]:
    """The click type for a field, and what the help adds about the value's form."""
    annotation = _without_none(info.annotation)
    choices = _literal_values(annotation)
    if choices is not None:
        return click.Choice([str(c) for c in choices]), ""
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        items = _literal_values(item)
        listed = f" of {', '.join(str(i) for i in items)}" if items else ""
        return None, f" A comma list{listed}."
    if annotation is int:
        return click.IntRange(**_bounds(info)), ""
    if annotation is float:
        return FiniteFloatRange(**_bounds(info)), ""
    return None, ""


def _shown(value: object, flag: tuple[str, str] | None) -> str:
    """A default as click shows one: a flag pair's name, ``""``, a list's items."""
    if flag is not None:
        return (flag[0] if value else flag[1]).removeprefix("--")
    if value == "":
        return '""'
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


class FileOverrideOption(click.Option):
    """An option that overrides a config file field: not given, it is None and the file (or
    the model's default) decides; ``--help`` shows that default."""

    def __init__(self, *args: Any, model_default: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_default = model_default

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        extra["default"] = f"{self.model_default} unless --config sets it"
        return extra


def config_option(
    model: type[BaseModel],
    path: str,
    flag: str,
    *,
    from_file: bool,
    envvar: list[str] | None = None,
    cite: Cite = "key",
    **kwargs: Any,
) -> Callable[[F], F]:
    """``--flag`` for the field of ``model`` at ``path`` (see the module's docstring).
    ``kwargs`` go to :func:`click.option` (a ``type`` there replaces the one made here)."""
    info = field_at(model, path)
    kind, form = option_type(info)
    annotation = _without_none(info.annotation)
    pair = (flag, f"--no-{flag.removeprefix('--')}") if annotation is bool else None
    decls = [f"{pair[0]}/{pair[1]}"] if pair else [flag]
    default = info.get_default(call_default_factory=True)
    settings: dict[str, Any] = {
        "help": help_text(info, path, cite) + form,
        "type": kind,
        "envvar": envvar,
        **kwargs,
    }
    if from_file:
        settings.update(cls=FileOverrideOption, default=None, model_default=_shown(default, pair))
    else:
        if isinstance(default, list):  # a comma list option takes the items as one string
            default = ",".join(str(v) for v in default)
        settings.setdefault("default", default)
        settings.setdefault("show_default", True)
    return click.option(*decls, **settings)
