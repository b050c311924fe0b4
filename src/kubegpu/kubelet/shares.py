"""Which pending pod a share-slot ``Allocate`` serves (what its container is told is
:func:`kubegpu.sharing.contract.share_contract`).

The device plugin API gives ``Allocate`` no pod identity, only the slot ids the kubelet chose.
We make the choice deterministic instead of guessing (docs/allocation-protocol.md, "Who calls
what"):

* slot ids encode their card (``<uuid>::slot-<n>``), so the card is known from the request;
* ``GetPreferredAllocation`` steers the kubelet to the card of the next pod we expect it to
  admit (the kubelet admits pods oldest first, and all containers of one pod in a row);
* ``Allocate`` serves the first pending pod, in that same order, whose extender decision names
  the slot's card and which still has a sharing container to allocate; the per-node ledger is
  the ``kubegpu.io/gpu-allocated`` annotation on each pod (which containers got which card), so
  a restarted agent continues exactly where the last one stopped;
* afterwards the kubelet's PodResources API (which does know pod ↔ device) is the truth the
  ledger is reconciled against.

Pods are read through :func:`kubegpu.sharing.claim.read_claim` (the protocol's one reader; its
codecs live in :mod:`kubegpu.sharing`). Pure: pod JSON and our values in, values out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kubegpu.sharing.annotations import AllocationDecision, CardShare
from kubegpu.sharing.claim import PodClaim, decided_for_another_node, read_claim, reconcile
from kubegpu.sharing.ledger import Ledger
from kubegpu.sharing.resources import ResourceNames

# --------------------------------------------------------------------------- reading pods
_NO_VERSION = 2**63  # sorts after every real resourceVersion


@dataclass(frozen=True)
class NodePod:
    """One pod on this node as the sharing coordinator needs it: its claim, with a decision
    only when it names this node."""

    claim: PodClaim
    # Containers asking for a share slot, in the kubelet's admission order (init containers,
    # then app containers, each in spec order), with what the decision gives each.
    slot_containers: tuple[tuple[str, CardShare], ...] = ()
    problem: str = ""

    @property
    def uid(self) -> str:
        return self.claim.uid

    @property
    def namespace(self) -> str:
        return self.claim.namespace

    @property
    def name(self) -> str:
        return self.claim.name

    @property
    def created(self) -> str:  # RFC 3339 (sorts chronologically)
        return self.claim.created

    @property
    def resource_version(self) -> str:
        return self.claim.resource_version

    @property
    def terminal(self) -> bool:
        return self.claim.terminal

    @property
    def decision(self) -> AllocationDecision | None:
        return self.claim.decision

    @property
    def ledger(self) -> Ledger | None:
        return self.claim.ledger

    @property
    def init_containers(self) -> frozenset[str]:  # sidecars included
        return self.claim.init_containers

    @property
    def sidecars(self) -> frozenset[str]:  # init containers with restartPolicy: Always
        return self.claim.sidecars

    @property
    def key(self) -> str:
        return self.claim.key

    @property
    def regular_init(self) -> frozenset[str]:
        """Init containers that run to completion before the next one starts. The kubelet's
        PodResources never lists them (fact sheet 2.3), although the devices they were given
        stay the pod's and go on to its next containers: what the agent recorded for them can
        never be confirmed there, only what the containers reusing their devices hold."""
        return self.init_containers - self.sidecars

    @property
    def shared(self) -> bool:
        return self.decision is not None and self.decision.shared

    @property
    def shared_card(self) -> str | None:
        """The card of the pod's first share (the extender decides one card per shared pod;
        the agent may record a pod the kubelet spread over several, see ``share_cards``)."""
        if self.decision is None or not self.decision.shared:
            return None
        return self.decision.cards[0].uuid

    def token(self, container: str) -> CardShare | None:
        return next((s for n, s in self.slot_containers if n == container), None)

    def allocated(self) -> set[str]:
        return self.ledger.names() if self.ledger is not None else set()

    def next_container(self) -> tuple[str, CardShare] | None:
        done = self.allocated()
        return next(((n, s) for n, s in self.slot_containers if n not in done), None)

    @property
    def order(self) -> tuple[int, int, str, str, str]:
        """The order the kubelet admits pods in, as far as the API shows it.

        A pod already part-way through admission first: the kubelet admits all containers of
        one pod before the next pod. Then bind order: the kubelet admits pods in the order its
        watch delivers them, which is the order they were bound (it sorts by creation time only
        pods that reach it in one batch, e.g. after a restart). The Binding is the last write
        to a pod before the kubelet admits it, so its resourceVersion gives that order, as the
        kubelet's own watch sees it. The extender's decision time does not: kube-scheduler
        binds in parallel, so a pod decided later can be bound first (seen on the real
        kube-scheduler). Where resourceVersions are not integers (the API calls them opaque),
        the decision time (microseconds) decides, then creation time."""
        decided = self.decision.decided_at if self.decision is not None else ""
        version = int(self.resource_version) if self.resource_version.isdigit() else _NO_VERSION
        return (0 if self.allocated() else 1, version, decided, self.created, self.uid)

    def with_records(self, decision: AllocationDecision | None, ledger: Ledger | None) -> NodePod:
        """This pod with rewritten annotations (the tokens follow the new decision)."""
        tokens = _container_tokens(decision) if decision is not None else {}
        slots = tuple((n, tokens.get(n, s)) for n, s in self.slot_containers)
        claim = reconcile(self.claim, decision=decision, ledger=ledger)
        return replace(self, claim=claim, slot_containers=slots)


def _container_tokens(decision: AllocationDecision) -> dict[str, CardShare]:
    return {c.name: c.cards[0] for c in decision.containers if c.cards}


def read_node_pod(pod: Mapping[str, Any], node: str, names: ResourceNames) -> NodePod:
    return node_pod(read_claim(pod, names), node)


def node_pod(claim: PodClaim, node: str) -> NodePod:
    """``claim`` as the agent of ``node`` sees it: a decision for another node is no decision."""
    problems = list(claim.problems)
    decision = claim.decision
    if decision is not None and decision.node != node:
        problems.append(decided_for_another_node(claim.key, decision.node, node))
        claim = replace(claim, decision=None)
        decision = None
    slots: list[tuple[str, CardShare]] = []
    if decision is not None and decision.shared:
        card = decision.cards[0]
        split = _container_tokens(decision)
        if claim.totals is None:
            problems.append(claim.refusal)
        containers = claim.totals.containers if claim.totals is not None else ()
        ordered = [c for c in containers if c.init] + [c for c in containers if not c.init]
        for c in ordered:
            if c.share_slots:
                share = split.get(c.name) or CardShare(
                    card.uuid, card.index, c.compute_milli, c.gpu_memory_mib
                )
                slots.append((c.name, share))
    return NodePod(claim, tuple(slots), "; ".join(problems))


def pending_share_pods(pods: Iterable[NodePod], card: str | None = None) -> list[NodePod]:
    """Live pods with a shared decision and a sharing container still to allocate (whose share
    is on ``card`` when given), in the order the kubelet will admit them."""
    found = []
    for p in pods:
        step = p.next_container() if not p.terminal and p.shared else None
        if step is not None and (card is None or step[1].uuid == card):
            found.append(p)
    return sorted(found, key=lambda p: p.order)


@dataclass(frozen=True)
class NextShare:
    """A container the next share-slot ``Allocate`` may be for, and the share it would get."""

    pod: NodePod
    container: str
    share: CardShare
    # PodResources shows the kubelet part-way through this pod: it is the one, for certain.
    admitting: bool = False


def share_candidates(
    pods: Iterable[NodePod],
    card: str | None = None,
    held: Mapping[tuple[str, str], Collection[str]] | None = None,
    slot: str | None = None,
) -> list[NextShare]:
    """Whom the next share-slot ``Allocate`` (on ``card``, when given; for ``slot``, when
    known) is for, likeliest first.

    ``held`` is the kubelet's PodResources answer, (namespace, pod) -> containers holding a
    share slot, or ``None`` without it. The kubelet allocates every container of a pod in a row
    (init containers first) and records each before the next; PodResources shows the pod's
    sidecars and app containers, never its regular init containers. So a pod that holds slots
    for some of its sharing containers but not for the ones after them (not counting regular
    init containers its ledger has served: nothing else can say they ran) is the pod being
    admitted: that pod alone is returned, whatever ``card`` is (a caller that sees its share on
    another card must refuse, not guess). So is a pod whose ledger records ``slot`` for one of
    its regular init containers: the kubelet hands such a device on only to the same pod's next
    container, and holds it for the pod meanwhile. Otherwise the pending pods in admission
    order, without those that already hold slots (the kubelet admitted them already)."""
    pods = sorted((p for p in pods if not p.terminal and p.shared), key=lambda p: p.order)
    if held is not None:
        for pod in pods:
            mine = held.get((pod.namespace, pod.name))
            names = [n for n, _ in pod.slot_containers]
            done = [names.index(n) for n in mine or () if n in names]
            if not done:
                continue
            served = pod.allocated() & pod.regular_init
            rest = [(n, s) for n, s in pod.slot_containers[max(done) + 1 :] if n not in served]
            if rest:
                name, share = rest[0]
                return [NextShare(pod, name, share, admitting=True)]
    if slot is not None:
        for pod in pods:
            step = pod.next_container()
            reused = pod.ledger is not None and any(
                c.slot == slot and c.name in pod.regular_init for c in pod.ledger.containers
            )
            if reused and step is not None:
                return [NextShare(pod, *step, admitting=True)]
    out: list[NextShare] = []
    for pod in pending_share_pods(pods, card):
        if held is not None and held.get((pod.namespace, pod.name)):
            continue
        step = pod.next_container()
        assert step is not None
        out.append(NextShare(pod, *step))
    return out


def shared_decision(pod: NodePod, tokens: Mapping[str, CardShare]) -> AllocationDecision:
    """``pod``'s shared decision with its sharing containers holding ``tokens``, and the pod's
    per-card totals recomputed as the extender computes a pod's request (kube-scheduler's
    rule: the app containers and sidecars add up, an init container counts alone beside the
    sidecars started before it, the larger of the two is what the pod holds), card by card."""
    assert pod.decision is not None
    containers = tuple(
        replace(c, cards=(tokens[c.name],)) if c.name in tokens else c
        for c in pod.decision.containers
    )
    order: list[str] = []
    index: dict[str, int] = {}
    for c in containers:
        for share in c.cards:
            if share.uuid not in index:
                order.append(share.uuid)
                index[share.uuid] = share.index
    cards: list[CardShare] = []
    for uuid in order:
        app = (0, 0)
        running = (0, 0)  # sidecars started so far
        peak = (0, 0)
        for c in containers:
            amount = _on_card(c.cards, uuid)
            if not c.init or c.name in pod.sidecars:
                app = _plus(app, amount)
            if c.init and c.name in pod.sidecars:
                running = _plus(running, amount)
                peak = _max(peak, running)
            elif c.init:
                peak = _max(peak, _plus(running, amount))
        total = _max(app, peak)
        cards.append(CardShare(uuid, index[uuid], total[0], total[1]))
    return replace(pod.decision, cards=tuple(cards), containers=containers)


def _on_card(cards: Sequence[CardShare], uuid: str) -> tuple[int, int]:
    return next(((s.compute_milli, s.gpu_memory_mib) for s in cards if s.uuid == uuid), (0, 0))


def _plus(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] + b[0], a[1] + b[1])


def _max(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (max(a[0], b[0]), max(a[1], b[1]))


def share_cards(pods: Iterable[NodePod]) -> dict[str, list[str]]:
    """Card UUID → live pods holding (or about to hold) a share of it."""
    out: dict[str, list[str]] = {}
    for p in pods:
        if p.terminal:
            continue
        cards = {c.uuid for c in p.ledger.containers} if p.ledger is not None else set()
        if p.decision is not None and p.decision.shared:
            cards.update(c.uuid for c in p.decision.cards)
        for uuid in sorted(cards):
            out.setdefault(uuid, []).append(p.key)
    return out


def whole_decision_cards(pods: Iterable[NodePod]) -> dict[str, str]:
    """Card UUID → live pod the extender gave it to whole."""
    out: dict[str, str] = {}
    for p in pods:
        if not p.terminal and p.decision is not None and not p.decision.shared:
            for card in p.decision.cards:
                out[card.uuid] = p.key
    return out


def preferred_whole_cards(
    pods: Iterable[NodePod], available: set[str], size: int
) -> tuple[str, ...] | None:
    """The cards of the oldest whole decision with a container of ``size`` cards that are all
    still available (allocated cards leave the kubelet's available set, so served decisions
    drop out by themselves)."""
    live = sorted(
        (p for p in pods if not p.terminal and p.decision and not p.decision.shared),
        key=lambda p: p.order,
    )
    for p in live:
        assert p.decision is not None
        for container in p.decision.containers:
            uuids = tuple(c.uuid for c in container.cards)
            if len(uuids) == size and set(uuids) <= available:
                return uuids
    return None


# --------------------------------------------------------------------------- describing
def describe_pending(pods: Sequence[NodePod]) -> str:
    if not pods:
        return "no pod on this node is waiting for a share"
    shown = ", ".join(f"{p.key} on card {_next_card(p)}" for p in pods[:5])
    return f"pods waiting for a share: {shown}{' …' if len(pods) > 5 else ''}"


def _next_card(pod: NodePod) -> str | None:
    step = pod.next_container()
    return step[1].uuid if step is not None else pod.shared_card
