"""The pods' records against what the kubelet really handed out (its PodResources API).

The kubelet knows pod ↔ device for sidecars and app containers (regular init containers are
never listed, so what was recorded for them stays unverified, and whole-GPU ones follow the
containers they handed their cards to). :class:`RecordKeeper` reads that answer and writes the
repairs :mod:`kubegpu.kubelet.records` works out back onto the pods, through the allocation
protocol's transitions (:func:`~kubegpu.sharing.claim.reconcile`): a container the kubelet gave
another pod's share exchanges records with that pod, a container missing from a ledger is
recorded, whole-GPU decisions are set to the cards held. Every repair is logged with node, pod
and card and noted in the pod's ``kubegpu.io/gpu-drift`` annotation; a share of another size
than asked for also in ``kubegpu.io/gpu-share-mismatch``. The coordinator runs it on a timer,
when a pod leaves, and before every share ``Allocate``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from kubegpu.kubelet.cluster import ConflictError, DeviceHolding, NodeApi, PodResourcesApi
from kubegpu.kubelet.pod_view import NodePodView
from kubegpu.kubelet.records import Holdings, Repair, follow_share_holdings, follow_whole_holdings
from kubegpu.kubelet.resources import ResourcePlan, card_of
from kubegpu.kubelet.shares import NodePod
from kubegpu.sharing.claim import annotation_patch, reconcile
from kubegpu.sharing.findings import findings

# A child of the coordinator's logger: these lines were the coordinator's, and a log filter
# or level set on it still covers them.
log = logging.getLogger("kubegpu.kubelet.coordinator.records")


def now_rfc3339(clock: Callable[[], float]) -> str:
    return datetime.fromtimestamp(clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class RecordKeeper:
    """Reads the kubelet's holdings and makes the pods' records follow them."""

    def __init__(
        self,
        node: str,
        api: NodeApi,
        view: NodePodView,
        pod_resources: PodResourcesApi | None,
        clock: Callable[[], float],
    ) -> None:
        self.node = node
        self.api = api
        self.view = view
        self.pod_resources = pod_resources
        self.clock = clock
        self.plans: list[ResourcePlan] = []
        # What the kubelet reported at the last PodResources List (card UUIDs).
        self.kubelet_share_cards: set[str] = set()
        self.kubelet_whole_cards: set[str] = set()
        self.drift_count = 0
        self.mismatch_count = 0

    async def holdings(self, why: str) -> list[DeviceHolding] | None:
        """The kubelet's PodResources answer, or ``None`` without one (not configured, or the
        kubelet did not answer: the ledgers alone then decide, as before PodResources)."""
        if self.pod_resources is None:
            return None
        try:
            return await self.pod_resources.list_holdings()
        except Exception as err:
            log.warning(
                "node %s: cannot list the kubelet's PodResources for %s (%s); going by the "
                "pods' ledgers alone",
                self.node,
                why,
                err,
            )
            return None

    def _resources(self, *, slots: bool) -> set[str]:
        # MIG devices are nobody's decision (the coordinator does not handle them).
        return {p.resource_name for p in self.plans if p.share_slots == slots and not p.mig}

    def note_kubelet_cards(self, holdings: Sequence[DeviceHolding]) -> None:
        """Remember which cards the kubelet reports in use, shared and whole."""
        self.kubelet_share_cards = {
            card_of(i) for ids in self.holdings_of(holdings, slots=True).values() for i in ids
        }
        self.kubelet_whole_cards = {
            card_of(i) for ids in self.holdings_of(holdings, slots=False).values() for i in ids
        }

    def holdings_of(self, holdings: Sequence[DeviceHolding], *, slots: bool) -> Holdings:
        names = self._resources(slots=slots)
        return {
            (h.namespace, h.pod, h.container): h.device_ids
            for h in holdings
            if h.resource in names and h.device_ids
        }

    def held_pods(
        self, holdings: Sequence[DeviceHolding], *, slots: bool
    ) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for namespace, pod, container in self.holdings_of(holdings, slots=slots):
            out.setdefault((namespace, pod), set()).add(container)
        return out

    def cards(self) -> dict[str, tuple[int, int]]:
        return {
            g.uuid: (g.index, g.memory_total_mib) for p in self.plans if not p.mig for g in p.gpus
        }

    def share_repairs(self, holdings: Sequence[DeviceHolding]) -> list[Repair]:
        return follow_share_holdings(
            self.view.pods,
            self.holdings_of(holdings, slots=True),
            node=self.node,
            index_of={u: i for u, (i, _) in self.cards().items()},
            now=now_rfc3339(self.clock),
        )

    def repairs(self, holdings: Sequence[DeviceHolding], shared: set[str]) -> list[Repair]:
        """Every repair that makes the records follow ``holdings`` (``shared``: the cards that
        hold shares, where no whole-GPU decision may move to)."""
        shares = self.share_repairs(holdings)
        wholes = follow_whole_holdings(
            self.view.pods,
            self.holdings_of(holdings, slots=False),
            cards=self.cards(),
            shared=shared,
        )
        return shares + wholes

    def followed(self, holdings: Sequence[DeviceHolding] | None, shared: set[str]) -> list[NodePod]:
        """This node's pods as their records will be once they follow ``holdings``."""
        pods = self.view.pods
        if holdings is None:
            return pods
        repairs = {r.pod.uid: r for r in self.repairs(holdings, shared)}
        return [_repaired(p, repairs[p.uid]) if p.uid in repairs else p for p in pods]

    async def apply(self, repairs: Sequence[Repair]) -> int:
        """Write ``repairs`` in order (holders of exchanged shares first, see
        :mod:`kubegpu.kubelet.records`); stops at the first pod that changed meanwhile (the
        next round re-reads and finishes). Returns how many findings were written."""
        found = 0
        now = now_rfc3339(self.clock)
        for repair in repairs:
            pod = repair.pod
            repaired = reconcile(
                pod.claim,
                decision=repair.decision,
                ledger=repair.ledger,
                drift=findings(now, repair.notes),
                mismatch=findings(now, repair.mismatches),
            )
            try:
                await self.api.patch_pod_annotations(
                    pod.namespace,
                    pod.name,
                    annotation_patch(pod.claim, repaired),
                    pod.resource_version,
                )
            except ConflictError:
                log.info("node %s: pod %s changed during reconcile; next round", self.node, pod.key)
                break
            for note in repair.notes:
                log.warning("node %s: pod %s: %s", self.node, pod.key, note)
            for mismatch in repair.mismatches:
                log.warning("node %s: pod %s: GPU share mismatch: %s", self.node, pod.key, mismatch)
            if not repair.notes:
                log.info("node %s: pod %s: PodResources confirms its cards", self.node, pod.key)
            found += len(repair.notes) + len(repair.mismatches)
            self.drift_count += len(repair.notes)
            self.mismatch_count += len(repair.mismatches)
            self.view.pods = [
                _repaired(p, repair) if p.uid == pod.uid else p for p in self.view.pods
            ]
        return found


def _repaired(pod: NodePod, repair: Repair) -> NodePod:
    return pod.with_records(repair.decision or pod.decision, repair.ledger or pod.ledger)
