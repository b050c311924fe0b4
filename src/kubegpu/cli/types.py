"""Click parameter types shared by the subcommands: numbers with a range that also refuses NaN.

``click.FloatRange`` compares with ``<``/``>``, which NaN always passes, so ``--interval nan``
would get through any range; and an interval or timeout of 0 (or less) makes a loop spin or a
wait return at once. Every such option takes one of these instead of a bare ``float``.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that refuses NaN and infinities."""

    name = "float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        converted = super().convert(value, param, ctx)
        if isinstance(converted, float) and not math.isfinite(converted):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return converted


def seconds(minimum: float = 0.0, maximum: float | None = None) -> FiniteFloatRange:
    """A duration in seconds greater than ``minimum`` (0: any positive duration)."""
    return FiniteFloatRange(min=minimum, max=maximum, min_open=True)


POSITIVE_SECONDS = seconds()
