"""Tests that need a tool or file from outside the virtualenv (the Go module cache, promtool):
they skip where it is missing on a developer's machine, and fail under CI (``CI`` set), where
.ci/run installs or fetches each of them before the unit tests, so that a CI run never passes
having tested nothing."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    return bool(os.environ.get("CI"))


def missing(what: str, how: str) -> NoReturn:
    """Fail under CI, skip elsewhere: ``what`` is missing, ``how`` says how to get it."""
    if under_ci():
        pytest.fail(f"{what}, under CI: {how}", pytrace=False)
    pytest.skip(f"{what} ({how})")
