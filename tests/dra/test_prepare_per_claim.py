"""NodePrepareResources / NodeUnprepareResources answer per claim, over the real gRPC socket with
the claims read over real HTTP (tests/dra/resource_api.py): one claim's API error, dropped
connection, malformed object or bad name is that claim's own error, the other claims of the call
are prepared, and the call itself never fails. A bad name is refused before any URL is built.
The checkpoint is written once per call, not once per claim."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.dra import AllocatedDevice, ClaimRef
from kubegpu.dra import checkpoint as checkpoint_module
from kubegpu.dra.cdi import spec_path
from kubegpu.dra.driver import ClaimPreparer
from kubegpu.dra.server import DraPluginServer
from kubegpu.kube.resource_claims import LightkubeResourceClaimSource

from .conftest import NODE, Node
from .resource_api import DROP, PREFIX, ResourceApi, serve
from .test_server import prepare, unprepare

DRIVER = "gpu.kubegpu.io"
GOOD = ClaimRef("team-a", "good", "eeeeeeee-0000-4000-8000-000000000001")


def claim_object(claim: ClaimRef, device: str = "gpu-0", results: Any = None) -> dict[str, Any]:
    if results is None:
        results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def claim_path(claim: ClaimRef) -> str:
    return f"{PREFIX}/namespaces/{claim.namespace}/resourceclaims/{claim.name}"


@pytest.fixture
async def api_node(node: Node) -> AsyncIterator[tuple[ResourceApi, Node]]:
    """``node`` served over its real sockets, its claims read from a ResourceApi over HTTP."""
    api = ResourceApi()
    api.claims[(GOOD.namespace, GOOD.name)] = claim_object(GOOD)
    async with serve(api) as client:
        preparer = ClaimPreparer(
            node.settings, node.inventory, LightkubeResourceClaimSource(client)
        )
        async with DraPluginServer(preparer, node.sockets):
            yield api, node


def failing(name: str, index: int) -> ClaimRef:
    return ClaimRef("team-a", name, f"eeeeeeee-0000-4000-8000-0000000001{index:02d}")


async def test_one_claims_api_error_or_malformed_object_fails_that_claim_alone(
    api_node: tuple[ResourceApi, Node],
) -> None:
    api, node = api_node
    broken = {
        failing("internal", 1): 500,
        failing("forbidden", 2): 403,
        failing("throttled", 3): 429,
        failing("dropped", 4): DROP,
    }
    for claim, failure in broken.items():
        api.claims[(claim.namespace, claim.name)] = claim_object(claim)
        api.fail_claims[(claim.namespace, claim.name)] = failure
    malformed = failing("malformed", 5)
    api.claims[(malformed.namespace, malformed.name)] = claim_object(malformed, results="gpu-0")
    status_string = failing("status-string", 6)
    api.claims[(status_string.namespace, status_string.name)] = {
        **claim_object(status_string),
        "status": "allocated",
    }
    last = ClaimRef("team-a", "last", "eeeeeeee-0000-4000-8000-000000000002")
    api.claims[(last.namespace, last.name)] = claim_object(last, "gpu-1")

    # The good claims first and last: neither before nor after a failure is lost.
    claims = [GOOD, *broken, malformed, status_string, last]
    response = await prepare(node, *claims)

    assert sorted(response.claims) == sorted(c.uid for c in claims)
    for ok, device in ((GOOD, "gpu-0"), (last, "gpu-1")):
        entry = response.claims[ok.uid]
        assert entry.error == ""
        assert [d.device_name for d in entry.devices] == [device]
        assert spec_path(node.settings.cdi_dir, ok.uid).exists()
    errors = {c.name: response.claims[c.uid].error for c in claims[1:-1]}
    for claim in claims[1:-1]:
        assert errors[claim.name].startswith(f"claim {claim}: "), errors[claim.name]
        assert not response.claims[claim.uid].devices
        assert not spec_path(node.settings.cdi_dir, claim.uid).exists()
    assert "the API server answered 500 InternalError: scripted 500" in errors["internal"]
    assert "the API server answered 403 Forbidden" in errors["forbidden"]
    assert "the API server answered 429 TooManyRequests" in errors["throttled"]
    assert "cannot read it from the API server: RemoteProtocolError" in errors["dropped"]
    assert "status.allocation.devices.results is a str, not a list" in errors["malformed"]
    assert "status is a str, not an object" in errors["status-string"]
    assert set(node.preparer().checkpoint.claims()) == {GOOD.uid, last.uid}

    # The kubelet retries the failed ones: once the API answers, they are prepared too.
    api.fail_claims.clear()
    again = await prepare(node, *broken)
    assert all(again.claims[c.uid].error == "" for c in broken)


@pytest.mark.parametrize(
    "bad",
    [
        ClaimRef("team-a", "../../../../api/v1/namespaces/kube-system/secrets/x", "bad-1"),
        ClaimRef("../../api/v1/namespaces/kube-system/secrets/x#", "train", "bad-2"),
        ClaimRef("team-a", "Train", "bad-3"),
        ClaimRef("team-a", "a" * 254, "bad-4"),
        ClaimRef("team-a", "", "bad-5"),
        ClaimRef("a" * 64, "train", "bad-6"),
        ClaimRef("team-a", "train?watch=true", "bad-7"),
        ClaimRef("team-a", "train", "../../etc/passwd"),
    ],
    ids=[
        "name-traversal",
        "namespace-traversal",
        "uppercase",
        "name-too-long",
        "empty-name",
        "namespace-too-long",
        "query",
        "uid-traversal",
    ],
)
async def test_a_name_kubernetes_could_not_have_given_is_refused_before_any_request(
    api_node: tuple[ResourceApi, Node], bad: ClaimRef
) -> None:
    api, node = api_node
    response = await prepare(node, bad, GOOD)
    error = response.claims[bad.uid].error
    assert "is not a Kubernetes" in error and error.startswith(f"claim {bad}: ")
    assert response.claims[GOOD.uid].error == ""
    # The only request the call made was the good claim's.
    assert api.paths == [claim_path(GOOD)]
    # Unprepare refuses it too (the UID would be a file name), and still serves the good one.
    gone = await unprepare(node, bad, GOOD)
    assert "is not a Kubernetes" in gone.claims[bad.uid].error
    assert gone.claims[GOOD.uid].error == ""
    assert not spec_path(node.settings.cdi_dir, GOOD.uid).exists()


async def test_the_claim_source_itself_builds_no_url_for_a_bad_name() -> None:
    # Defence in depth: the kube edge checks too, whoever calls it.
    api = ResourceApi()
    bad = ClaimRef("team-a", "../../../../api/v1/namespaces/kube-system/secrets/x", "uid-1")
    async with serve(api) as client:
        with pytest.raises(LookupError, match="is not a Kubernetes object name"):
            await LightkubeResourceClaimSource(client).allocation(bad, DRIVER)
    assert api.paths == []


async def test_one_claim_that_cannot_be_unprepared_fails_alone(
    api_node: tuple[ResourceApi, Node],
) -> None:
    api, node = api_node
    other = ClaimRef("team-a", "other", "eeeeeeee-0000-4000-8000-000000000003")
    api.claims[(other.namespace, other.name)] = claim_object(other, "gpu-1")
    assert all(e.error == "" for e in (await prepare(node, GOOD, other)).claims.values())
    # A folder where its CDI spec is: removing the spec fails, for this claim only.
    stuck = spec_path(node.settings.cdi_dir, GOOD.uid)
    stuck.unlink()
    stuck.mkdir()
    (stuck / "x").write_text("")
    response = await unprepare(node, GOOD, other)
    assert response.claims[GOOD.uid].error.startswith(f"claim {GOOD}: ")
    assert response.claims[other.uid].error == ""
    assert set(node.preparer().checkpoint.claims()) == {GOOD.uid}


async def test_a_call_of_many_claims_writes_the_checkpoint_once(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rewriting the whole checkpoint per claim made a call of N claims cost N^2 (1,500 claims:
    # 96 s). Counted, not timed: every write of the checkpoint file goes through this.
    writes: list[Path] = []
    real = checkpoint_module.write_atomically

    def counted(path: Path, text: str, mode: int = 0o600) -> None:
        writes.append(path)
        real(path, text, mode)

    monkeypatch.setattr(checkpoint_module, "write_atomically", counted)
    claims = [ClaimRef("team-a", f"c{i}", f"ffffffff-0000-4000-8000-{i:012d}") for i in range(200)]
    for i, claim in enumerate(claims):
        node.claims.allocate(claim, AllocatedDevice("gpu", NODE, f"gpu-{i % 2}"))
    missing = ClaimRef("team-a", "missing", "ffffffff-0000-4000-8000-999999999999")
    async with DraPluginServer(node.preparer(), node.sockets):
        response = await prepare(node, *claims, missing)
        assert sum(e.error == "" for e in response.claims.values()) == len(claims)
        assert writes == [node.settings.checkpoint_path]
        # Answered from the checkpoint: nothing new, nothing written.
        await prepare(node, *claims)
        assert len(writes) == 1
        response = await unprepare(node, *claims, missing)
        assert all(e.error == "" for e in response.claims.values())
        assert len(writes) == 2
    assert node.preparer().checkpoint.claims() == {}
    assert list(node.settings.cdi_dir.iterdir()) == []


async def test_a_checkpoint_that_cannot_be_written_fails_the_calls_new_claims(
    node: Node,
) -> None:
    node.claims.allocate(GOOD, AllocatedDevice("gpu", NODE, "gpu-0"))
    preparer = node.preparer()
    # The state folder replaced by a file: the checkpoint's temp file cannot be made.
    state = node.settings.checkpoint_path.parent
    state.mkdir(parents=True, exist_ok=True)
    state.rmdir()
    state.write_text("not a folder")
    async with DraPluginServer(preparer, node.sockets):
        response = await prepare(node, GOOD)
    error = response.claims[GOOD.uid].error
    assert error.startswith(f"claim {GOOD}: ") and str(state) in error
    assert preparer.checkpoint.claims() == {}
