"""The extender's DRA view over real HTTP: it lists our driver's slices and every claim, follows
their watches, relists on 410, and starts only when asked."""

from __future__ import annotations

from pathlib import Path

from kubegpu.core.dra import AllocatedDevice
from kubegpu.dra.slices import pool_name
from kubegpu.kube.dra_view import DraClusterView
from kubegpu.kube.list_watch import Backoff
from kubegpu.testing.apiserver.server import RequestRecord
from kubegpu.testing.waiting import wait_until_async
from tests.deploy.rbac import allowed, rbac_rules
from tests.extender.dra_api import DraApi, serve
from tests.extender.dra_cluster import (
    DRIVER,
    claim,
    node_slice,
    share_request,
    share_result,
    whole_result,
)


def other_drivers_slice() -> dict[str, object]:
    obj = node_slice("n9", 1)
    obj["metadata"]["name"] = "n9-nvidia"
    obj["spec"]["driver"] = "gpu.nvidia.com"
    return obj


async def test_lists_then_follows_slices_and_claims_by_watch() -> None:
    api = DraApi()
    api.put("resourceslices", node_slice("n1", 2))
    api.put("resourceslices", other_drivers_slice())
    api.put("resourceclaims", claim("a", results=[share_result("n1", 0, "20Gi", "250")]))
    async with serve(api) as client:
        view = DraClusterView(client, backoff=Backoff(0.01, 0.05))
        assert not api.lists  # nothing is listed before ranking asks
        view.start()
        view.start()  # idempotent
        try:
            await wait_until_async(view.synced.is_set, timeout_s=30, what="the first lists")
            assert sorted(api.lists) == [
                ("resourceclaims", ""),
                ("resourceslices", f"spec.driver={DRIVER}"),
            ]
            assert [d.name for d in view.devices_on("n1")] == ["gpu-0", "gpu-1"]
            assert view.devices_on("n9") == ()  # another driver's slice is not ours
            assert view.allocated_in(pool_name("n1")) == [
                AllocatedDevice("gpu", pool_name("n1"), "gpu-0", "s", 20 * 2**30, 250)
            ]

            # Watch events: a new claim, the first one deleted, the slice republished bigger.
            await wait_until_async(lambda: len(api.watches) == 2, timeout_s=30, what="watches")
            api.put("resourceclaims", claim("b", [share_request("8Gi", "100")]))
            api.put("resourceclaims", claim("c", results=[whole_result("n1", 1)]))
            api.delete("resourceclaims", claim("a"))
            api.put("resourceslices", node_slice("n1", 3, generation=2))
            await wait_until_async(
                lambda: (
                    len(view.devices_on("n1")) == 3
                    and view.claim("default", "a") is None
                    and view.claim("default", "b") is not None
                    and view.claim("default", "c") is not None
                ),
                timeout_s=30,
                what="the watched changes",
            )
            assert view.allocated_in(pool_name("n1")) == [
                AllocatedDevice("gpu", pool_name("n1"), "gpu-1")
            ]
            pending = view.claim("default", "b")
            assert pending is not None and not pending.allocated and pending.requests

            # 410 Gone: both kinds are listed again, and what changed meanwhile is seen.
            lists = len(api.lists)
            api.expire_watches()
            api.delete("resourceclaims", claim("c"))
            await wait_until_async(
                lambda: len(api.lists) >= lists + 2 and view.claim("default", "c") is None,
                timeout_s=30,
                what="a relist after 410",
            )
            assert view.allocated_in(pool_name("n1")) == []
        finally:
            await view.close()
    # Every call it made is one the extender's ClusterRole grants (every overlay binds it).
    made = [
        RequestRecord(verb, kind, None, None)
        for verb, calls in (("list", api.lists), ("watch", api.watches))
        for kind, _ in calls
    ]
    assert {r.resource for r in made} == {"resourceslices", "resourceclaims"}
    role = Path(__file__).resolve().parents[2] / "deploy" / "base" / "extender-clusterrole.yaml"
    rules = list(rbac_rules(role))
    assert [r for r in made if not allowed(rules, r)] == []
    # The check can fail: without the resource.k8s.io rule none of them is granted.
    core_only = [(ns, rule) for ns, rule in rules if rule["apiGroups"] != ["resource.k8s.io"]]
    assert not any(allowed(core_only, r) for r in made)
