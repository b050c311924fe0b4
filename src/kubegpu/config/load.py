"""Reading the config file and applying overrides: flag > env > file > defaults.

Flags and ``KUBEGPU_*`` environment variables reach here already merged (click resolves a flag
before its environment variable) as dotted-path overrides, applied on top of the file's data
before validation, so one validation pass reports every source's mistakes the same way: the
field path and the bad value.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from kubegpu.config.model import AgentConfig


class ConfigError(Exception):
    """The configuration is invalid; ``str()`` names the field path and the bad value."""

    def __init__(self, message: str, field: str = "", value: object = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


def _set_path(data: dict[str, Any], dotted: str, value: object) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[leaf] = value


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's raw mapping (YAML or JSON); an empty file is an empty config."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config file {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
            f"{err.start})"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"malformed YAML in {path}{where}: {problem}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path}: the top level must be a mapping, got {type(data).__name__}",
            field="<root>",
            value=data,
        )
    return data


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that holds the field at ``loc`` (list indexes and dict keys skipped)."""
    model: type[BaseModel] = AgentConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = next((f for name, f in model.model_fields.items() if part in (name, f.alias)), None)
        if field is None:
            continue  # a free-form key (a dict entry): stay on the model it belongs to
        inner = _model_in(field.annotation)
        if inner is None:
            return None
        model = inner
    return model


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(loc: Sequence[int | str]) -> str:
    model = _model_at(loc)
    if model is None:
        return ""
    keys = [f.alias or name for name, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known here: {', '.join(keys)})"


def _describe(err: ValidationError, source: str) -> ConfigError:
    # A misspelt key is both unknown and a missing required one: name the misspelling first.
    first = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    field = ".".join(str(p) for p in first["loc"])
    value = first.get("input")
    msg = (
        "unknown field" + _did_you_mean(first["loc"])
        if first["type"] == "extra_forbidden"
        else first["msg"]
    )
    if not field:
        # A model-level check; its message already starts with the field path.
        text = msg.removeprefix("Value error, ")
        field = text.split(":", 1)[0]
        return ConfigError(f"invalid config ({source}): {text}", field=field)
    shown = json.dumps(value, default=str) if not isinstance(value, dict) else "{…}"
    more = len(err.errors()) - 1
    extra = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return ConfigError(
        f"invalid config ({source}): {field}: {msg.removeprefix('Value error, ')}; "
        f"got {shown}{extra}",
        field=field,
        value=value,
    )


def load_config(
    path: Path | None = None, overrides: Mapping[str, object] | None = None
) -> AgentConfig:
    """Defaults, then the file (if any), then ``overrides`` (camelCase dotted paths)."""
    data: dict[str, Any] = read_config_file(path) if path is not None else {}
    for dotted, value in (overrides or {}).items():
        _set_path(data, dotted, value)
    source = str(path) if path is not None else "defaults and flags"
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as err:
        raise _describe(err, source) from err


def render_config(config: AgentConfig) -> str:
    """The resolved config on one line (JSON), for the start-up log."""
    return json.dumps(config.model_dump(mode="json", by_alias=True), separators=(",", ":"))
