"""Records that follow the kubelet: what each container was really handed, per PodResources.

``Allocate`` is told the device ids, never the pod (docs/allocation-protocol.md, "Who calls
what"). For a share slot the agent therefore hands out the share decided for the pod it expects
the kubelet to be admitting and records that grant — slot, card, MiB, milli, exactly the values
in the env — in that pod's ledger under that container's name. When the kubelet was really
admitting another pod, the grant sits in the wrong pod's records. The kubelet's PodResources API
knows which container holds which slot, so the records are repaired from it:

* **Exchange.** Container ``P/c`` holds slot ``S``, and the grant for ``S`` is recorded under
  ``X/n``, which does not hold it: ``P/c`` got the share decided for ``X/n``. The two swap both
  their decided shares and their ledger entries. ``P/c``'s records then say what it holds
  (the grant, as handed out), and ``X/n`` takes over what had been decided (and perhaps already
  handed out) for ``P/c``. Nothing is created or lost, only relabelled, so every card's total
  over the pods' decisions stays what the extender decided and what was handed out. The holder
  is written first with a :class:`~kubegpu.sharing.ledger.Trade` note; an agent that stops
  before ``X``'s records are rewritten leaves a state the next one finishes (``_finish``).
* **No record.** Nobody recorded a grant for ``S`` (the ledger was lost or edited): the holder
  is recorded with its own decided share on ``S``'s card, the only guess there is.

A pod's shares may end up on several cards (a multi-container pod whose first container got
another pod's share): its decision then names each of them, as the annotation protocol allows
for shared decisions the agent rewrites. Whole GPUs are simpler: the kubelet never gives one
card to two pods, so a pod's decision is set to the cards it holds, and a pod not yet admitted
whose decided card another pod took is moved to a card nobody holds or is decided on.

Pure: pods and PodResources holdings in, rewritten records and findings out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from kubegpu.kubelet.resources import card_of
from kubegpu.kubelet.shares import NodePod, shared_decision
from kubegpu.sharing.annotations import AllocationDecision, CardShare, ContainerAllocation
from kubegpu.sharing.ledger import GrantedContainer, Ledger, Trade

# (namespace, pod name, container) -> device ids the kubelet gave that container.
Holdings = Mapping[tuple[str, str, str], Sequence[str]]
_Key = tuple[str, str]  # (pod uid, container)


@dataclass(frozen=True)
class Repair:
    """New records for one pod. ``decision``/``ledger`` are ``None`` when they stay as they
    are. ``notes`` are drift findings (logged, and written to ``kubegpu.io/gpu-drift``);
    ``mismatches`` say that a container got a share of another size than it asked for (logged
    as warnings, written to ``kubegpu.io/gpu-share-mismatch``). ``first``: it carries a new
    trade note, so it must be written before the other pods of this round."""

    pod: NodePod
    decision: AllocationDecision | None = None
    ledger: Ledger | None = None
    notes: tuple[str, ...] = ()
    mismatches: tuple[str, ...] = ()
    first: bool = False


def _size(share: CardShare) -> str:
    return f"{share.gpu_memory_mib} MiB, {share.compute_milli} milli"


class _Shares:
    """The working state of one pass over the shared pods."""

    def __init__(self, pods: Iterable[NodePod], held: Holdings) -> None:
        self.live = [p for p in pods if not p.terminal and p.shared]
        self.by_uid = {p.uid: p for p in self.live}
        self.by_name = {(p.namespace, p.name): p for p in self.live}
        self.tokens: dict[_Key, CardShare] = {
            (p.uid, n): s for p in self.live for n, s in p.slot_containers
        }
        self.ledger: dict[_Key, GrantedContainer] = {
            (p.uid, c.name): c
            for p in self.live
            if p.ledger is not None
            for c in p.ledger.containers
            if (p.uid, c.name) in self.tokens
        }
        self.holding: dict[_Key, str] = {}
        for (namespace, name, container), ids in held.items():
            pod = self.by_name.get((namespace, name))
            if pod is not None and (pod.uid, container) in self.tokens and ids:
                self.holding[(pod.uid, container)] = sorted(ids)[0]
        self.changed: set[str] = set()
        self.first: set[str] = set()
        self.notes: dict[str, list[str]] = {}
        self.mismatches: dict[str, list[str]] = {}

    def note(self, uid: str, text: str) -> None:
        self.notes.setdefault(uid, []).append(text)
        self.changed.add(uid)

    def admission(self, key: _Key) -> tuple[tuple[int, int, str, str, str], int]:
        pod = self.by_uid[key[0]]
        names = [n for n, _ in pod.slot_containers]
        return pod.order, names.index(key[1])

    def put(self, key: _Key, granted: GrantedContainer | None) -> None:
        if granted is None:
            self.ledger.pop(key, None)
        else:
            self.ledger[key] = granted
        self.changed.add(key[0])

    # -- the three steps ---------------------------------------------------------------------

    def finish(self) -> None:
        """Complete exchanges an earlier agent wrote only the holder's side of."""
        for key, entry in list(self.ledger.items()):
            trade = entry.trade
            if trade is None:
                continue
            namespace, _, name = trade.pod.partition("/")
            other = self.by_name.get((namespace, name))
            if other is None:
                continue
            peer = (other.uid, trade.container)
            stale = self.ledger.get(peer)
            if (
                peer not in self.tokens
                or stale is None
                or stale.slot != entry.slot
                or self.holding.get(peer) == entry.slot
            ):
                continue
            self.tokens[peer] = trade.token
            self.put(peer, None if trade.grant is None else replace(trade.grant, name=peer[1]))
            holder = self.by_uid[key[0]]
            self.note(
                peer[0],
                f"container {peer[1]}: takes over the share decided for {holder.key} container "
                f"{key[1]} ({_size(trade.token)} on card {trade.token.uuid}); finishing an "
                "exchange of records an earlier agent started",
            )

    def exchange_all(self) -> None:
        for key in sorted(self.holding, key=self.admission):
            slot = self.holding[key]
            own = self.ledger.get(key)
            if own is not None and own.slot == slot:
                if not own.verified:
                    self.put(key, replace(own, verified=True))
                continue
            source = self._source(key, slot)
            if source is not None:
                self._exchange(key, source, slot)

    def _source(self, key: _Key, slot: str) -> _Key | None:
        """Who the grant ``key`` holds is recorded under: the latest grant of ``slot`` (the
        kubelet hands a slot on only after its holder is gone, or to the next container of the
        pod whose regular init container had it; that init container's own grant is not the
        one we look for, and PodResources never shows it holding anything)."""
        pod = self.by_uid[key[0]]
        found = [
            other
            for other, entry in self.ledger.items()
            if other != key
            and entry.slot == slot
            and self.holding.get(other) != slot
            and not (other[0] == key[0] and other[1] in pod.regular_init)
        ]
        if not found:
            return None
        return max(found, key=lambda k: (self.ledger[k].allocated_at, self.admission(k)))

    def _exchange(self, key: _Key, source: _Key, slot: str) -> None:
        holder, owner = self.by_uid[key[0]], self.by_uid[source[0]]
        mine, theirs = self.tokens[key], self.tokens[source]
        before, grant = self.ledger.get(key), self.ledger[source]
        self.tokens[key], self.tokens[source] = theirs, mine
        kept = None if before is None else replace(before, trade=None)
        trade = Trade(owner.key, source[1], mine, kept)
        self.put(key, replace(grant, name=key[1], verified=True, trade=trade))
        self.put(source, None if kept is None else replace(kept, name=source[1], verified=False))
        self.first.add(key[0])
        recorded = f"card {before.uuid} (slot {before.slot})" if before else "nothing"
        self.note(
            key[0],
            f"container {key[1]}: the agent recorded {recorded} for it; the kubelet gave it "
            f"slot {slot} on card {grant.uuid}, handed out as the share decided for {owner.key} "
            f"container {source[1]}; records exchanged",
        )
        self.note(
            source[0],
            f"container {source[1]}: its share ({_size(theirs)} on card {theirs.uuid}) went to "
            f"{holder.key} container {key[1]}; takes over the share decided for that one "
            f"({_size(mine)} on card {mine.uuid}); records exchanged",
        )
        if (mine.compute_milli, mine.gpu_memory_mib) != (
            theirs.compute_milli,
            theirs.gpu_memory_mib,
        ):
            self.mismatches.setdefault(key[0], []).append(
                f"container {key[1]} got the share decided for {owner.key} container "
                f"{source[1]} ({_size(theirs)} on card {theirs.uuid}) instead of its own "
                f"({_size(mine)}): the kubelet admitted the pods in another order than the "
                f"node agent expected; delete and recreate pod {holder.key} to get the share "
                "it asked for"
            )
            self.mismatches.setdefault(source[0], []).append(
                f"container {source[1]} gets the share decided for {holder.key} container "
                f"{key[1]} ({_size(mine)} on card {mine.uuid}) instead of its own "
                f"({_size(theirs)}): the kubelet admitted the pods in another order than the "
                f"node agent expected; delete and recreate pod {owner.key} to get the share "
                "it asked for"
            )

    def record_unknown(self, index_of: Mapping[str, int], now: str) -> None:
        """Holders whose grant nobody recorded: their own decided share, on the slot's card."""
        for key in sorted(self.holding, key=self.admission):
            slot = self.holding[key]
            own = self.ledger.get(key)
            if own is not None and own.slot == slot:
                continue
            card = str(card_of(slot))
            token = self.tokens[key]
            if token.uuid != card:
                self.tokens[key] = replace(token, uuid=card, index=index_of.get(card, token.index))
                self.note(
                    key[0],
                    f"container {key[1]}: the kubelet runs it on card {card}, its share was "
                    f"decided on card {token.uuid}; decision moved so the extender accounts "
                    "the truth",
                )
            self.put(
                key,
                GrantedContainer(
                    key[1],
                    card,
                    slot,
                    token.compute_milli,
                    token.gpu_memory_mib,
                    now,
                    verified=True,
                    source="podresources",
                ),
            )
            if own is None:
                text = (
                    f"container {key[1]}: the kubelet gave it share slot {slot} on card {card} "
                    "but the agent had no record of it; recorded"
                )
            else:
                text = (
                    f"container {key[1]}: the agent recorded card {own.uuid} (slot {own.slot}), "
                    f"the kubelet gave card {card} (slot {slot}); repaired"
                )
            self.note(key[0], text)

    def repairs(self, node: str) -> list[Repair]:
        out: list[Repair] = []
        for pod in self.live:
            if pod.uid not in self.changed:
                continue
            tokens = {n: self.tokens[(pod.uid, n)] for n, _ in pod.slot_containers}
            decision = None
            if any(tokens[n] != s for n, s in pod.slot_containers):
                decision = shared_decision(pod, tokens)
            kept = [
                c for c in (pod.ledger.containers if pod.ledger else ()) if c.name not in tokens
            ]
            entries = [self.ledger[(pod.uid, n)] for n in tokens if (pod.uid, n) in self.ledger]
            ledger = Ledger(pod.ledger.node if pod.ledger else node, (*kept, *entries))
            if decision is None and ledger == pod.ledger and pod.uid not in self.notes:
                continue
            out.append(
                Repair(
                    pod,
                    decision,
                    None if ledger == pod.ledger else ledger,
                    tuple(self.notes.get(pod.uid, ())),
                    tuple(self.mismatches.get(pod.uid, ())),
                    pod.uid in self.first,
                )
            )
        out.sort(key=lambda r: (not r.first, r.pod.order))
        return out


def follow_share_holdings(
    pods: Iterable[NodePod],
    held: Holdings,
    *,
    node: str,
    index_of: Mapping[str, int],
    now: str,
) -> list[Repair]:
    """The shared pods whose records differ from what PodResources shows (``held``: share-slot
    holdings only), with their new records, holders of exchanged shares first."""
    state = _Shares(pods, held)
    state.finish()
    state.exchange_all()
    state.record_unknown(index_of, now)
    return state.repairs(node)


# --------------------------------------------------------------------------- whole GPUs
def follow_whole_holdings(
    pods: Iterable[NodePod],
    held: Holdings,
    *,
    cards: Mapping[str, tuple[int, int]],
    shared: Iterable[str] = (),
) -> list[Repair]:
    """Whole-GPU decisions rewritten to the cards the kubelet gave (``held``: whole-GPU
    holdings of every pod; ``cards``: uuid -> (index, memory MiB); ``shared``: cards holding
    shares, never free)."""
    pods = list(pods)
    live = sorted(
        (p for p in pods if not p.terminal and p.decision is not None and not p.decision.shared),
        key=lambda p: p.order,
    )
    by_pod: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
    holder: dict[str, str] = {}
    for (namespace, name, container), ids in held.items():
        uuids = tuple(dict.fromkeys(str(card_of(i)) for i in ids))
        by_pod.setdefault((namespace, name), {})[container] = uuids
        for uuid in uuids:
            holder.setdefault(uuid, f"{namespace}/{name}")

    def whole(uuid: str) -> CardShare:
        index, memory = cards.get(uuid, (-1, 0))
        return CardShare(uuid, index, 1000, memory)

    decisions: dict[str, AllocationDecision] = {}
    notes: dict[str, list[str]] = {}
    given_up: list[str] = []
    for pod in live:
        assert pod.decision is not None
        mine = by_pod.get((pod.namespace, pod.name))
        if not mine:
            continue
        containers: list[ContainerAllocation] = []
        moves: dict[str, str] = {}  # decided card -> the one the kubelet gave instead
        for c in pod.decision.containers:
            got = mine.get(c.name)
            decided = tuple(s.uuid for s in c.cards)
            if got is None or set(got) == set(decided) or any(u not in cards for u in got):
                containers.append(c)
                continue
            lost = [u for u in decided if u not in got]
            for old, new in zip(lost, [u for u in got if u not in decided], strict=False):
                moves.setdefault(old, new)
            containers.append(replace(c, cards=tuple(whole(u) for u in got)))
            notes.setdefault(pod.uid, []).append(
                f"container {c.name}: decided card(s) {','.join(decided)}, the kubelet gave "
                f"{','.join(got)}; decision moved so the extender accounts the truth"
            )
        # PodResources never lists a regular init container, but the kubelet hands its cards
        # on to the pod's next containers (the extender decides them that way too): it follows
        # their moves, or the pod would be accounted a card it never held.
        for i, c in enumerate(containers):
            if c.name not in pod.regular_init or c.name in mine:
                continue
            decided = tuple(s.uuid for s in c.cards)
            followed = tuple(dict.fromkeys(moves.get(u, u) for u in decided))
            if followed == decided:
                continue
            containers[i] = replace(c, cards=tuple(whole(u) for u in followed))
            notes.setdefault(pod.uid, []).append(
                f"init container {c.name}: decided card(s) {','.join(decided)}, the kubelet "
                f"handed its pod's containers {','.join(followed)} instead; moved with them "
                "(PodResources does not list init containers)"
            )
        if pod.uid in notes:
            decisions[pod.uid] = _whole_decision(pod.decision, containers)
            given_up += [s.uuid for s in pod.decision.cards]

    def named(p: NodePod) -> set[str]:
        decision = decisions.get(p.uid, p.decision)
        return {s.uuid for s in decision.cards} if decision is not None else set()

    taken = set(holder) | set(shared) | {u for p in live for u in named(p)}
    free = [u for u in dict.fromkeys(given_up) if u not in taken] + sorted(
        (u for u in cards if u not in taken and u not in given_up), key=lambda u: cards[u][0]
    )
    for pod in live:
        assert pod.decision is not None
        if (pod.namespace, pod.name) in by_pod:
            continue
        lost = [s.uuid for s in pod.decision.cards if holder.get(s.uuid, pod.key) != pod.key]
        if not lost or len(lost) > len(free):
            continue
        moved = dict(zip(lost, free, strict=False))
        free = free[len(lost) :]
        containers = [
            replace(c, cards=tuple(whole(moved.get(s.uuid, s.uuid)) for s in c.cards))
            for c in pod.decision.containers
        ]
        decisions[pod.uid] = _whole_decision(pod.decision, containers)
        notes.setdefault(pod.uid, []).append(
            "; ".join(
                f"decided card {old} was given to {holder[old]}; takes over card {new}, "
                "which nobody holds"
                for old, new in moved.items()
            )
        )
    return [
        Repair(p, decisions[p.uid], notes=tuple(notes.get(p.uid, ())))
        for p in live
        if p.uid in decisions
    ]


def _whole_decision(
    decision: AllocationDecision, containers: Sequence[ContainerAllocation]
) -> AllocationDecision:
    union: dict[str, CardShare] = {}
    for c in containers:
        for share in c.cards:
            union.setdefault(share.uuid, share)
    return replace(decision, cards=tuple(union.values()), containers=tuple(containers))
