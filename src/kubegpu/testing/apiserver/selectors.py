"""Label and field selectors, parsed and matched the way the real API server does.

Parsing is strict (a malformed selector is a 400, as on a real server) so that a client which
builds selectors wrongly fails here and not first in production.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.testing.apiserver.errors import bad_request

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_label_key(key: str) -> bool:
    if not LABEL_KEY.match(key):
        return False
    prefix, _, _ = key.rpartition("/")
    return len(prefix) <= 253


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(LABEL_VALUE.match(value))


@dataclass(frozen=True)
class Requirement:
    key: str
    # one of: =, !=, in, notin, exists, !, gt, lt
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=" or self.op == "in":
            return present and value in self.values
        if self.op == "!=" or self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        # gt / lt compare integers; a non-integer label never matches, as upstream.
        try:
            number = int(value) if value is not None else None
        except ValueError:
            return False
        if number is None:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside an ``in (...)`` value list."""
    terms: list[str] = []
    depth = 0
    current = ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise bad_request(f"unable to parse requirement: unbalanced ')' in {selector!r}")
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if depth != 0:
        raise bad_request(f"unable to parse requirement: unbalanced '(' in {selector!r}")
    terms.append(current.strip())
    return [t for t in terms if t] if selector.strip() else []


_SET_TERM = re.compile(r"^(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_BINARY_TERM = re.compile(
    r"^(?P<key>[^\s!=<>(),]+)\s*(?P<op>==|=|!=|>|<)\s*(?P<value>[^\s!=<>(),]*)$"
)


def parse_label_selector(selector: str) -> tuple[Requirement, ...]:
    requirements: list[Requirement] = []
    for term in _split_terms(selector):
        requirement = _parse_label_term(term)
        if not is_label_key(requirement.key):
            raise bad_request(f"unable to parse requirement: invalid label key {requirement.key!r}")
        for value in requirement.values:
            if requirement.op not in ("gt", "lt") and not is_label_value(value):
                raise bad_request(f"unable to parse requirement: invalid label value {value!r}")
        requirements.append(requirement)
    return tuple(requirements)


def _parse_label_term(term: str) -> Requirement:
    if term.startswith("!"):
        return Requirement(term[1:].strip(), "!")
    match = _SET_TERM.match(term)
    if match:
        values = tuple(v.strip() for v in match["values"].split(",") if v.strip())
        if not values:
            raise bad_request(
                f"unable to parse requirement: {term!r}: "
                "for 'in', 'notin' operators, values set can't be empty"
            )
        return Requirement(match["key"], match["op"], values)
    match = _BINARY_TERM.match(term)
    if match:
        op = {"==": "=", "=": "=", "!=": "!=", ">": "gt", "<": "lt"}[match["op"]]
        value = match["value"]
        if op in ("gt", "lt") and not re.fullmatch(r"-?\d+", value):
            raise bad_request(
                "unable to parse requirement: for 'Gt', 'Lt' operators, "
                f"the value must be an integer: {term!r}"
            )
        return Requirement(match["key"], op, (value,))
    if re.fullmatch(r"[^\s!=<>(),]+", term):
        return Requirement(term, "exists")
    raise bad_request(f"unable to parse requirement: {term!r}")


def labels_match(requirements: tuple[Requirement, ...], obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in requirements)


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str


def parse_field_selector(selector: str, allowed: frozenset[str]) -> tuple[FieldRequirement, ...]:
    requirements: list[FieldRequirement] = []
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        match = re.fullmatch(r"(?P<field>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*)", term)
        if not match:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        if match["field"] not in allowed:
            raise bad_request(f"field label not supported: {match['field']}")
        requirements.append(FieldRequirement(match["field"], match["op"] != "!=", match["value"]))
    return tuple(requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares against; a missing field reads as ``""``."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        # Booleans like spec.unschedulable default to false on the real server.
        return "false" if path in ("spec.unschedulable", "spec.hostNetwork") else ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def fields_match(requirements: tuple[FieldRequirement, ...], obj: Mapping[str, Any]) -> bool:
    return all((field_value(obj, r.field) == r.value) == r.equal for r in requirements)
