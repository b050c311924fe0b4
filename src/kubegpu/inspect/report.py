"""The values of the inspect report: cards, the pods on them, totals, pending pods and drift.

Frozen dataclasses and the enums they carry, shared by the model that builds them
(:mod:`kubegpu.inspect.model`), the renderers (:mod:`kubegpu.inspect.render`,
:mod:`kubegpu.inspect.gpushare`) and the command. Separate from the model so a renderer reads
what a report is without the rules that compute it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kubegpu.placement.model import MILLI_PER_GPU


class UsageState(enum.Enum):
    OFF = "off"  # not asked for
    OK = "ok"
    UNAVAILABLE = "unavailable"  # asked, no answer: shown as "?"


class InventoryState(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # the node agent has not published one
    INVALID = "invalid"  # published but unreadable


class PendingState(enum.Enum):
    BINDING = "binding"  # decided and recorded, not yet bound
    STARTING = "starting"  # bound with a decision, containers not started (no Allocate yet)
    UNSCHEDULED = "unscheduled"  # asks for GPUs, no node and no decision yet
    # The scheduler tried and said no (PodScheduled=False); it tries again when the cluster
    # changes. The demo summary and the scheduler stand-in call these pods "refused" too.
    REFUSED = "refused"


class UnplacedReason(enum.Enum):
    NO_DECISION = "no-decision"  # whole GPUs without an allocation annotation
    UNKNOWN_CARD = "unknown-card"  # the decision names a card the node does not publish
    NO_INVENTORY = "no-inventory"  # the node publishes no (readable) inventory


class PlacedBy(enum.Enum):
    """Who says which card a pod holds."""

    DECISION = "decision"  # the extender's allocation annotation
    # The node's kubelet (PodResources, read through the exporter): a whole-GPU pod the
    # extender never decided for, placed only when usage was fetched.
    KUBELET = "kubelet"


class WarningKind(enum.Enum):
    OVERCOMMITTED_CARD = "overcommitted-card"
    UNKNOWN_CARD = "unknown-card"
    UNHEALTHY_CARD_IN_USE = "unhealthy-card-in-use"
    DECISION_NODE_MISMATCH = "decision-node-mismatch"
    INDEX_MISMATCH = "index-mismatch"
    MALFORMED_ALLOCATION = "malformed-allocation"
    INVALID_INVENTORY = "invalid-inventory"
    MISSING_INVENTORY = "missing-inventory"
    SHARE_WITHOUT_DECISION = "share-without-decision"
    NOT_ENOUGH_FREE_CARDS = "not-enough-free-cards"
    OVER_SHARE = "over-share"
    UNREADABLE_POD = "unreadable-pod"
    INVALID_MIG_DEVICES = "invalid-mig-devices"


@dataclass(frozen=True)
class PodOnCard:
    """One pod's hold on one card (pod totals over its containers, as the extender charges)."""

    namespace: str
    name: str
    phase: str
    shared: bool
    memory_mib: int
    compute_milli: int
    bound: bool = True
    used_memory_mib: int | None = None  # from the exporter, when it reported this pod
    over_share: bool | None = None
    placed_by: PlacedBy = PlacedBy.DECISION

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class CardView:
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    allocated_memory_mib: int
    allocated_compute_milli: int
    pods: tuple[PodOnCard, ...] = ()
    used_memory_mib: int | None = None
    utilization_ratio: float | None = None

    @property
    def free_memory_mib(self) -> int:
        return max(0, self.memory_mib - self.allocated_memory_mib)

    @property
    def overcommitted(self) -> bool:
        return (
            self.allocated_memory_mib > self.memory_mib
            or self.allocated_compute_milli > MILLI_PER_GPU
        )


@dataclass(frozen=True)
class UnplacedPod:
    """A pod charged to the node whose cards are unknown (see :class:`UnplacedReason`)."""

    namespace: str
    name: str
    phase: str
    reason: UnplacedReason
    whole_gpus: int
    compute_milli: int
    memory_mib: int  # what its decision says; for no-decision pods: the extender's assumption

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Totals:
    """Sums over cards (a node) or nodes (the cluster). ``gpus`` counts published cards, or
    the advertised ``nvidia.com/gpu`` count where no inventory is published."""

    nodes: int
    gpus: int
    healthy_gpus: int
    memory_mib: int
    allocated_memory_mib: int
    allocated_compute_milli: int
    free_gpus: int  # healthy cards with nothing allocated
    largest_free_memory_mib: int  # the biggest share one healthy card can still take
    unplaced_whole_gpus: int
    used_memory_mib: int | None = None  # sum over cards with a reading; None: no reading
    pods: int = 0


@dataclass(frozen=True)
class MigPod:
    """A pod holding a MIG device, as the node's kubelet names it (through the exporter)."""

    namespace: str
    name: str
    phase: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class MigDeviceView:
    uuid: str
    profile: str
    start: int  # placement: first memory slice, and how many
    slices: int
    memory_mib: int
    gpu_instance_id: int
    resource: str  # "" when not advertised
    healthy: bool
    pods: tuple[MigPod, ...] = ()


@dataclass(frozen=True)
class MigCardView:
    """A card served by its MIG devices (published in ``kubegpu.io/mig-devices``, not in the
    inventory: no share or whole-card figure applies to it)."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    devices: tuple[MigDeviceView, ...]


@dataclass(frozen=True)
class MigRequest:
    """A pod on the node asking for ``count`` MIG devices of ``resource``, which ones not known
    (usage not fetched, or the exporter names none for it)."""

    namespace: str
    name: str
    phase: str
    resource: str
    profile: str  # of the node's MIG devices under that resource ("3g.40gb")
    count: int
    memory_mib: int  # one such device's

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeView:
    name: str
    address: str
    inventory: InventoryState
    cards: tuple[CardView, ...]
    unplaced: tuple[UnplacedPod, ...]
    totals: Totals
    advertised_gpus: int = 0
    inventory_error: str = ""
    usage: UsageState = UsageState.OFF
    usage_error: str = ""
    mig_cards: tuple[MigCardView, ...] = ()
    mig_requests: tuple[MigRequest, ...] = ()
    mig_error: str = ""  # the MIG devices annotation is unreadable

    @property
    def mig_devices(self) -> int:
        return sum(len(c.devices) for c in self.mig_cards)


@dataclass(frozen=True)
class PendingCard:
    uuid: str
    index: int
    memory_mib: int
    compute_milli: int


@dataclass(frozen=True)
class PendingPod:
    namespace: str
    name: str
    state: PendingState
    node: str  # the decided (or bound) node; empty while unscheduled
    whole_gpus: int
    memory_mib: int  # shared requests: MiB asked for on one card
    compute_milli: int
    cards: tuple[PendingCard, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DriftWarning:
    kind: WarningKind
    message: str
    node: str = ""
    uuid: str = ""
    pod: str = ""  # namespace/name


@dataclass(frozen=True)
class Filters:
    nodes: tuple[str, ...] = ()
    namespace: str = ""


@dataclass(frozen=True)
class InspectReport:
    generated_at: str
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingPod, ...]
    warnings: tuple[DriftWarning, ...]
    totals: Totals
    filters: Filters = Filters()
    cpu_only_nodes: int = 0
    usage: UsageState = UsageState.OFF
