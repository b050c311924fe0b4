"""A pod's GPU claim: the one reader, its phases, the transitions and the one writer."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.inspect.model import build_report
from kubegpu.inspect.report import WarningKind
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    decode_allocation,
    encode_allocation,
)
from kubegpu.sharing.claim import (
    ClaimError,
    ClaimPhase,
    annotation_patch,
    decide,
    grant,
    read_claim,
    reconcile,
    release,
)
from kubegpu.sharing.findings import (
    DRIFT_ANNOTATION,
    MISMATCH_ANNOTATION,
    Findings,
    decode_findings,
    encode_findings,
)
from kubegpu.sharing.ledger import ALLOCATED_ANNOTATION, GrantedContainer, Ledger, decode_ledger
from kubegpu.sharing.podstate import read_pod
from kubegpu.sharing.resources import ResourceNames

NAMES = ResourceNames()
SHARE = CardShare("g0", 0, 300, 4096)
SHARED = AllocationDecision(
    "n1", (SHARE,), (ContainerAllocation("main", False, (SHARE,)),), "t", "binpack", True
)
GRANTED = GrantedContainer("main", "g0", "g0::slot-0", 300, 4096, "t2")


def pod(
    *,
    node: str = "",
    phase: str = "Pending",
    limits: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = (
        limits
        if limits is not None
        else {
            "kubegpu.io/gpu-memory": "4096",
            "kubegpu.io/gpu-compute": "300",
            "kubegpu.io/gpu-shared": "1",
        }
    )
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "annotations": annotations or {},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "resources": {"limits": limits, "requests": {}}}],
        },
        "status": {"phase": phase},
    }


def decided(**kw: Any) -> dict[str, Any]:
    return pod(annotations={ALLOCATION_ANNOTATION: encode_allocation(SHARED)}, **kw)


@pytest.mark.parametrize(
    ("raw", "phase"),
    [
        pytest.param(pod(limits={"cpu": "1"}), ClaimPhase.NONE, id="cpu-only"),
        pytest.param(pod(), ClaimPhase.ASKING, id="asking"),
        pytest.param(decided(), ClaimPhase.DECIDED, id="decided-not-bound"),
        pytest.param(decided(node="n1"), ClaimPhase.BOUND, id="bound"),
        pytest.param(pod(node="n1"), ClaimPhase.UNRECORDED, id="bound-without-decision"),
        pytest.param(decided(node="n2"), ClaimPhase.UNRECORDED, id="decision-for-another-node"),
        pytest.param(decided(node="n1", phase="Succeeded"), ClaimPhase.RELEASED, id="terminal"),
        pytest.param(
            pod(limits={"kubegpu.io/gpu-memory": "lots"}), ClaimPhase.UNREADABLE, id="unreadable"
        ),
    ],
)
def test_the_phase_follows_from_what_the_pod_says(raw: dict[str, Any], phase: ClaimPhase) -> None:
    assert read_claim(raw, NAMES).phase is phase


def test_a_claim_is_granted_once_the_agent_recorded_every_decided_share() -> None:
    raw = decided(node="n1")
    raw["metadata"]["annotations"][ALLOCATED_ANNOTATION] = (
        '{"v":1,"node":"n1","containers":[{"name":"main","uuid":"g0","slot":"g0::slot-0",'
        '"computeMilli":300,"memoryMiB":4096,"allocatedAt":"t2","verified":false,'
        '"source":"allocate"}]}'
    )
    claim = read_claim(raw, NAMES)
    assert claim.phase is ClaimPhase.GRANTED
    assert claim.ledger == Ledger("n1", (GRANTED,))


def test_the_reader_parses_request_and_records_once() -> None:
    claim = read_claim(decided(), NAMES)
    assert claim.request is not None and claim.totals is not None
    assert (claim.request.compute_milli, claim.request.gpu_memory_mib) == (300, 4096)
    assert claim.decision == SHARED and claim.recorded
    assert claim.resource_version == "7" and claim.key == "ns/p"


def test_a_request_that_cannot_be_served_keeps_its_totals_and_says_why() -> None:
    # A share without its slot: charged (totals) but refused (no request).
    claim = read_claim(
        pod(limits={"kubegpu.io/gpu-memory": "1024", "kubegpu.io/gpu-compute": "100"}), NAMES
    )
    assert claim.totals is not None and claim.request is None
    assert "kubegpu.io/gpu-shared" in claim.refusal


def test_decide_writes_only_the_allocation_and_release_removes_it() -> None:
    claim = read_claim(pod(), NAMES)
    decided_claim = decide(claim, SHARED)
    patch = annotation_patch(claim, decided_claim)
    assert list(patch) == [ALLOCATION_ANNOTATION]
    assert decode_allocation(patch[ALLOCATION_ANNOTATION]) == SHARED
    assert annotation_patch(decided_claim, release(decided_claim)) == {ALLOCATION_ANNOTATION: None}


def test_release_removes_even_a_malformed_decision() -> None:
    claim = read_claim(pod(annotations={ALLOCATION_ANNOTATION: "{not json"}), NAMES)
    assert claim.decision is None and claim.recorded and "not JSON" in claim.problem
    assert annotation_patch(claim, release(claim)) == {ALLOCATION_ANNOTATION: None}


def test_a_bound_pod_cannot_be_decided_again() -> None:
    with pytest.raises(ClaimError, match="already bound to n1"):
        decide(read_claim(decided(node="n1"), NAMES), SHARED)


def test_grant_writes_only_the_ledger() -> None:
    claim = read_claim(decided(node="n1"), NAMES)
    patch = annotation_patch(claim, grant(claim, GRANTED, "n1"))
    assert list(patch) == [ALLOCATED_ANNOTATION]
    assert decode_ledger(patch[ALLOCATED_ANNOTATION]) == Ledger("n1", (GRANTED,))


def test_reconcile_writes_what_changed_and_its_findings() -> None:
    claim = read_claim(decided(node="n1"), NAMES)
    moved = CardShare("g1", 1, 300, 4096)
    decision = AllocationDecision(
        "n1", (moved,), (ContainerAllocation("main", False, (moved,)),), "t", "binpack", True
    )
    after = reconcile(
        claim,
        decision=decision,
        drift=Findings("2026-01-01T00:00:00Z", ("moved", "again")),
        mismatch=Findings("2026-01-01T00:00:00Z", ("smaller",)),
    )
    patch = annotation_patch(claim, after)
    assert set(patch) == {ALLOCATION_ANNOTATION, DRIFT_ANNOTATION, MISMATCH_ANNOTATION}
    assert patch[DRIFT_ANNOTATION] == "2026-01-01T00:00:00Z moved; again"
    assert annotation_patch(claim, reconcile(claim)) == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T00:00:00Z a; b", Findings("2026-01-01T00:00:00Z", ("a", "b"))),
        ("no time here", Findings("", ("no time here",))),
        (None, None),
    ],
)
def test_findings_codec(text: str | None, expected: Findings | None) -> None:
    assert decode_findings(text) == expected
    if expected is not None and expected.at:
        assert encode_findings(expected) == text


def test_extender_view_and_inspect_word_a_decision_for_another_node_alike() -> None:
    raw = decided(node="n2")
    reading = read_pod(raw, NAMES)
    report = build_report([], [raw], names=NAMES, generated_at="t")
    judged = [
        w.message
        for w in report.warnings
        if w.kind is WarningKind.DECISION_NODE_MISMATCH and "allocation names" in w.message
    ]
    assert judged == [reading.problem]
    assert "names node n1 but the pod is bound to n2" in reading.problem
