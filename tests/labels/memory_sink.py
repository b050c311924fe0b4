"""A label sink that keeps what it was given, for tests that run the labeller end to end."""

from __future__ import annotations

from collections.abc import Mapping


class MemorySink:
    def __init__(self) -> None:
        self.labels: dict[str, str] = {}

    def apply(self, labels: Mapping[str, str]) -> None:
        self.labels = dict(labels)

    def current(self) -> Mapping[str, str] | None:
        return self.labels
