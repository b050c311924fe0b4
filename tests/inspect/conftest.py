from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_namespace
from tests.inspect import mixed_cluster


@pytest.fixture
def apiserver() -> Iterator[ServerThread]:
    """The fake API server holding the mixed cluster."""
    with FakeApiServer().run_in_thread() as server:
        for namespace in ("default", "ml", "web"):
            server.store.put("namespaces", make_namespace(namespace))
        for node in mixed_cluster.nodes():
            server.store.put("nodes", node)
        for pod in mixed_cluster.pods():
            server.store.put("pods", pod)
        yield server


@pytest.fixture
def kubeconfig(apiserver: ServerThread, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")
