"""``docs/helm-values.md``, generated from the Helm chart's ``values.yaml`` and its schema.

Run ``python -m kubegpu.docgen.helm_values --write`` from the repository root after changing
``deploy/helm/kubegpu/values.yaml`` (``--check`` exits 1 when the file is stale; plain prints to
stdout).

The description of a key is the comment block directly above it in ``values.yaml`` (no blank
line between), so the file an admin copies and the reference say the same; the default is the
value written there; the type and the allowed values come from ``values.schema.json``, which
is what ``helm install`` enforces. A key without a comment, or one the schema does not know,
is an error here rather than a gap in the reference.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubegpu.docgen.output import emit

CHART = Path("deploy/helm/kubegpu")
DEFAULT_OUTPUT = Path("docs/helm-values.md")
REGENERATE = "python -m kubegpu.docgen.helm_values --write"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9]*):(?: (?P<value>.*))?$")
_COMMENT = re.compile(r"^(?P<indent> *)# ?(?P<text>.*)$")


class ValuesDocError(ValueError):
    """values.yaml or its schema cannot be documented as they are (names the key)."""


@dataclass(frozen=True)
class ValueKey:
    """One key of values.yaml: its dotted path, its comment, and what the file and schema say."""

    path: str
    description: str
    section: bool
    default: Any
    schema: dict[str, Any]


def parse_values(text: str) -> list[tuple[str, str, bool, str | None]]:
    """(dotted path, comment above it, is a section, the raw inline value) per key, in order.

    Only the simple YAML that values.yaml is written in: two-space indentation, one key per
    line, values inline (``{}`` for an empty map); anything else is refused.
    """
    found: list[tuple[str, str, bool, str | None]] = []
    stack: list[str] = []
    comment: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            comment = []
            continue
        if match := _COMMENT.match(line):
            comment.append(match["text"])
            continue
        match = _KEY.match(line)
        if match is None:
            raise ValuesDocError(f"values.yaml line {number}: not a `key: value` line: {line!r}")
        depth, odd = divmod(len(match["indent"]), 2)
        if odd or depth > len(stack):
            raise ValuesDocError(
                f"values.yaml line {number}: indentation is not two spaces a level"
            )
        stack = [*stack[:depth], match["key"]]
        value = match["value"]
        value = None if value is None or value.startswith("#") else value
        found.append((".".join(stack), " ".join(comment).strip(), value is None, value))
        comment = []
    return found


def _schema_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        properties = node.get("properties", {})
        if part not in properties:
            raise ValuesDocError(f"{path}: not in values.schema.json")
        node = properties[part]
    return node


def value_keys(chart: Path = CHART) -> list[ValueKey]:
    """Every key of the chart's values.yaml, described, with its default and schema."""
    text = (chart / "values.yaml").read_text(encoding="utf-8")
    schema = json.loads((chart / "values.schema.json").read_text(encoding="utf-8"))
    keys = []
    for path, description, section, raw in parse_values(text):
        if not description:
            raise ValuesDocError(f"{path}: no comment above it in values.yaml")
        default = None if raw is None else yaml.safe_load(raw)
        keys.append(ValueKey(path, description, section, default, _schema_at(schema, path)))
    return keys


def _type(schema: dict[str, Any]) -> str:
    kind = str(schema.get("type", "any"))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "map of string to string"
    return kind


def _allowed(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return ", ".join(f"`{v}`" for v in schema["enum"])
    bounds = []
    if "minimum" in schema:
        bounds.append(f">= {schema['minimum']}")
    if "maximum" in schema:
        bounds.append(f"<= {schema['maximum']}")
    if "pattern" in schema:
        bounds.append(f"matches `{schema['pattern']}`")
    return "; ".join(bounds)


def render(chart: Path = CHART) -> str:
    lines = [
        "# Helm values reference",
        "",
        f"<!-- Generated from {CHART}/values.yaml and values.schema.json by `{REGENERATE}`;",
        "     edit those files, not this one (tests/docs/test_helm_values_reference.py checks it"
        " is current). -->",
        "",
        "Every value of the chart `deploy/helm/kubegpu` (docs/install.md shows how to install"
        " it). The schema accepts no other key: a misspelt one fails `helm install`,"
        " `helm upgrade` and `helm template` with a message naming it. Set values with"
        " `--set key=value` or a file given with `-f`.",
        "",
    ]
    for key in value_keys(chart):
        depth = key.path.count(".")
        if key.section and depth == 0:
            lines += [f"## `{key.path}`", "", key.description, ""]
            continue
        lines += [f"### `{key.path}`", ""]
        if not key.section:
            shown = json.dumps(key.default) if not isinstance(key.default, str) else key.default
            lines.append(f"- Default: `{shown}`" if shown != "" else "- Default: empty")
        lines.append(f"- Type: {_type(key.schema)}")
        if allowed := _allowed(key.schema):
            lines.append(f"- Allowed: {allowed}")
        lines += ["", key.description, ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubegpu.docgen.helm_values",
        description="Write docs/helm-values.md from the Helm chart's values.yaml and schema.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {DEFAULT_OUTPUT}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {DEFAULT_OUTPUT} is stale")
    args = parser.parse_args(argv)
    try:
        text = render()
    except (OSError, ValuesDocError) as error:
        print(f"helm-values: {error}", file=sys.stderr)
        return 2
    return emit(text, DEFAULT_OUTPUT, write=args.write, check=args.check, regenerate=REGENERATE)


if __name__ == "__main__":
    sys.exit(main())
