"""The claim-budget ledger's decisions over a scriptable cluster: the budget label, the stored
claims, the published cards, concurrent creates in one namespace, and what is refused when
something cannot be read."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from kubegpu.kube.resource_claims import claim_demand
from kubegpu.sharing.claim_budget import (
    BUDGET_LABEL,
    ClaimDemand,
    DriverCards,
    FakeClaimBudgetFacts,
    default_class_drivers,
)
from kubegpu.webhook.claim_ledger import ClaimLedger

GI = 1 << 30
NS = "team-a"


def share(name: str, memory: str | None, *, cls: str = "gpu-share.kubegpu.io") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def decode(obj: Any) -> ClaimDemand:
    return claim_demand(obj, default_class_drivers())


def stored(name: str, memory: str | None, **kw: Any) -> ClaimDemand:
    return decode(share(name, memory, **kw))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def facts(budget: str | None = "80Gi", *claims: ClaimDemand) -> FakeClaimBudgetFacts:
    f = FakeClaimBudgetFacts(decode=decode, labels={NS: budget} if budget else {})
    f.store(claims)
    f.published = {"gpu.kubegpu.io": DriverCards(80 * GI, 640 * GI)}
    return f


async def test_claims_within_the_budget_are_admitted_and_charged() -> None:
    ledger = ClaimLedger(facts("80Gi", stored("a", "40Gi")))
    verdict = await ledger.admit(NS, share("b", "40Gi"))
    assert verdict.allowed and verdict.charged_bytes == 40 * GI
    assert ledger.pending(NS) == {"uid-b": 40 * GI}


async def test_a_claim_past_the_budget_is_refused_with_the_figures() -> None:
    ledger = ClaimLedger(facts("80Gi", stored("a", "40Gi"), stored("b", "40Gi")))
    verdict = await ledger.admit(NS, share("c", "16Gi"))
    assert verdict.refusal == (
        "namespace team-a: resource claims would hold 96Gi of GPU memory, over the budget of "
        f"80Gi (label {BUDGET_LABEL}): this claim asks for 16Gi and the namespace's claims "
        "hold 80Gi"
    )
    assert ledger.pending(NS) == {}


async def test_a_namespace_without_the_label_is_not_budgeted() -> None:
    ledger = ClaimLedger(facts(None, stored("a", "800Gi")))
    assert (await ledger.admit(NS, share("b", "800Gi"))).allowed


async def test_a_claim_for_no_gpu_is_admitted_without_reading_the_cluster() -> None:
    f = facts("0", stored("a", "40Gi"))
    f.failure = "must not be read"
    verdict = await ClaimLedger(f).admit(NS, share("nic", None, cls="sriov.example.com"))
    assert verdict.allowed and f.lists == 0


async def test_a_whole_gpu_is_charged_the_largest_published_card() -> None:
    ledger = ClaimLedger(facts("100Gi", stored("a", "40Gi")))
    verdict = await ledger.admit(NS, share("whole", None, cls="gpu.kubegpu.io"))
    assert not verdict.allowed
    assert "would hold 120Gi" in verdict.refusal and "asks for 80Gi" in verdict.refusal


async def test_claims_being_deleted_free_their_memory() -> None:
    going = dataclasses.replace(stored("a", "80Gi"), deleting=True)
    assert (await ClaimLedger(facts("80Gi", going)).admit(NS, share("b", "80Gi"))).allowed


async def test_concurrent_creates_cannot_both_slip_under_the_budget() -> None:
    """Two 48Gi claims arrive together under an 80Gi budget while nothing is stored yet: the
    first is decided while the second waits, and the second counts the first though no list
    shows it."""
    f = facts("80Gi")
    release = asyncio.Event()
    f.gate = release.wait
    ledger = ClaimLedger(f)
    first = asyncio.create_task(ledger.admit(NS, share("a", "48Gi")))
    second = asyncio.create_task(ledger.admit(NS, share("b", "48Gi")))
    await asyncio.sleep(0.01)
    assert f.lists == 1  # the second waits for the namespace, not for the list
    release.set()
    verdicts = await asyncio.gather(first, second)
    assert [v.allowed for v in verdicts] == [True, False]
    assert "the namespace's claims hold 48Gi" in verdicts[1].refusal


async def test_other_namespaces_are_decided_beside_each_other() -> None:
    f = facts("80Gi")
    f.labels["team-b"] = "80Gi"
    release = asyncio.Event()
    f.gate = release.wait
    ledger = ClaimLedger(f)
    other = share("x", "8Gi")
    other["metadata"]["namespace"] = "team-b"
    tasks = [
        asyncio.create_task(ledger.admit(NS, share("a", "8Gi"))),
        asyncio.create_task(ledger.admit("team-b", other)),
    ]
    await asyncio.sleep(0.01)
    assert f.lists == 2
    release.set()
    assert all(v.allowed for v in await asyncio.gather(*tasks))


async def test_an_admitted_claim_is_forgotten_once_listed_and_its_stored_copy_counts() -> None:
    f = facts("80Gi")
    ledger = ClaimLedger(f)
    assert (await ledger.admit(NS, share("a", "48Gi"))).allowed
    f.store([stored("a", "48Gi")])
    verdict = await ledger.admit(NS, share("b", "48Gi"))
    assert "the namespace's claims hold 48Gi" in verdict.refusal  # once, not twice
    assert ledger.pending(NS) == {}


async def test_an_admitted_claim_never_stored_stops_counting_after_the_pending_time() -> None:
    clock = Clock()
    ledger = ClaimLedger(facts("80Gi"), pending_s=30, clock=clock)
    assert (await ledger.admit(NS, share("a", "48Gi"))).allowed
    clock.now += 29
    assert not (await ledger.admit(NS, share("b", "48Gi"))).allowed
    clock.now += 2
    assert (await ledger.admit(NS, share("b", "48Gi"))).allowed


async def test_a_dry_run_is_decided_but_not_remembered() -> None:
    ledger = ClaimLedger(facts("80Gi"))
    assert (await ledger.admit(NS, share("a", "48Gi"), dry_run=True)).allowed
    assert ledger.pending(NS) == {}
    assert (await ledger.admit(NS, share("b", "48Gi"))).allowed


async def test_a_malformed_budget_refuses_gpu_claims_naming_label_and_value() -> None:
    verdict = await ClaimLedger(facts("80GB")).admit(NS, share("a", "1Gi"))
    assert verdict.refusal.startswith(
        f"kubegpu claim budget: namespace team-a: label {BUDGET_LABEL}='80GB' is not a "
        "quantity of bytes such as 80Gi"
    )
    assert verdict.refusal.endswith(
        "no claim for GPUs is admitted there until an admin corrects it"
    )


async def test_a_cluster_that_cannot_be_read_refuses_naming_what_failed() -> None:
    f = facts("80Gi")
    f.failure = "cannot read namespace team-a: the API server answered 403 Forbidden: no"
    verdict = await ClaimLedger(f).admit(NS, share("a", "1Gi"))
    assert verdict.refusal == (
        "kubegpu claim budget: namespace team-a: cannot read namespace team-a: the API server "
        "answered 403 Forbidden: no"
    )


async def test_a_whole_gpu_with_no_card_published_is_refused_asking_for_the_memory() -> None:
    f = facts("80Gi")
    f.published = {}
    verdict = await ClaimLedger(f).admit(NS, share("a", None, cls="gpu.kubegpu.io"))
    assert "no ResourceSlice of driver gpu.kubegpu.io publishes a card's memory" in verdict.refusal
    assert verdict.refusal.startswith("kubegpu claim budget: namespace team-a has a budget: ")


async def test_a_claim_that_cannot_be_read_is_refused_naming_the_field() -> None:
    verdict = await ClaimLedger(facts("80Gi")).admit(NS, share("a", "plenty"))
    assert verdict.refusal.startswith(
        "kubegpu claim budget: resourceclaim team-a/a request gpu: capacity.requests.memory:"
    )
