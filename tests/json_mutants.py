"""Walking a JSON document to break it one value at a time: the generative wrong-type tests of
every surface that reads JSON (the peer webhook's reviews, the extender's verbs, the DRA
ranker's pods) share these two helpers."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

JsonPath = tuple[str | int, ...]


def paths(value: Any, at: JsonPath = ()) -> Iterator[JsonPath]:
    """Every path to a value nested in ``value`` (``value`` itself excluded): object keys and
    list indexes, outermost first."""
    if not isinstance(value, dict | list):
        return
    items: Any = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        yield (*at, key)
        yield from paths(item, (*at, key))


def replaced(doc: Any, path: JsonPath, new: Any) -> Any:
    """A copy of ``doc`` with the value at ``path`` (non-empty) replaced by ``new``."""
    out = copy.deepcopy(doc)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = copy.deepcopy(new)
    return out
