"""Fixtures shared across test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubegpu.testing.apiserver import FakeApiServer, ServerThread


@pytest.fixture
def fake_api_server() -> Iterator[ServerThread]:
    """A fresh fake Kubernetes API server (real HTTP on a loopback port) for one test."""
    with FakeApiServer().run_in_thread() as handle:
        yield handle
