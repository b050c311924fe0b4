"""The GPU-memory budget of a namespace's DRA ResourceClaims: what a claim is charged, whether
a new one fits, and the words of a refusal (docs/quotas.md, "GPU memory of DRA claims";
docs/decisions/0011).

Kubernetes' ResourceQuota counts a claim's *devices*, never the capacity a share consumes, so a
namespace could hold a cluster's GPU memory with one-device claims. An admin sets a budget on
the namespace with the label :data:`BUDGET_LABEL`; the claim-budget webhook refuses a claim
that would take the namespace's claims past it. Everything here is pure: the webhook reads the
namespace, its claims and the published cards through :class:`ClaimBudgetFacts` (the kube edge
implements it, :class:`FakeClaimBudgetFacts` stands in for tests) and decides with these
functions.

What a claim is charged (the worst case it can be allocated, so a claim never holds more than
it was charged):

* per request for one of kubegpu's DRA device classes (either naming), ``count`` times the
  ``capacity.requests.memory`` it names;
* a request naming no memory is charged a whole card: the requestPolicy default of kubegpu's
  devices is the card's memory, and a whole-GPU claim holds the card. Which card is not known
  until allocation, so it is the largest card any ResourceSlice of that driver publishes;
* ``allocationMode: All`` is charged the largest node's total (every card of one node);
* ``firstAvailable`` is charged its most expensive subrequest;
* requests for other device classes cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kubegpu.core.dra import DRA_NAMINGS
from kubegpu.sharing.resources import RequestError, parse_quantity

# The namespace label an admin sets to budget the namespace's claims (a quantity of bytes,
# e.g. "80Gi"). A label, not an annotation: the webhook's namespaceSelector can match only
# labels, and one key that both selects and sets the budget cannot drift apart.
BUDGET_LABEL = "kubegpu.io/dra-gpu-memory-budget"


def default_class_drivers() -> dict[str, str]:
    """DeviceClass -> driver for every DRA naming kubegpu publishes under (kubegpu's classes
    and NVIDIA's ``gpu.nvidia.com``): a budget counts the GPU memory of either."""
    return {cls: n.driver for n in DRA_NAMINGS.values() for cls in sorted(n.device_classes)}


@dataclass(frozen=True)
class DeviceAsk:
    """One way a request can be met: ``count`` devices of ``driver`` (None: allocationMode
    All), each with ``memory_bytes`` (None: the request names no memory: a whole card)."""

    driver: str
    count: int | None
    memory_bytes: int | None


@dataclass(frozen=True)
class RequestDemand:
    """One ``spec.devices.requests`` entry for a GPU class: its alternatives (one for
    ``exactly``, the GPU subrequests of ``firstAvailable``)."""

    name: str
    alternatives: tuple[DeviceAsk, ...]


@dataclass(frozen=True)
class ClaimDemand:
    """What a ResourceClaim asks of GPU classes. ``deleting``: it has a deletionTimestamp (its
    memory is being given back, so it no longer counts)."""

    namespace: str
    name: str
    uid: str
    requests: tuple[RequestDemand, ...] = ()
    deleting: bool = False

    @property
    def asks_for_gpus(self) -> bool:
        return bool(self.requests)

    @property
    def needs_cards(self) -> bool:
        """Whether pricing it needs the published cards (some ask names no memory, or All)."""
        return any(
            a.memory_bytes is None or a.count is None for r in self.requests for a in r.alternatives
        )


@dataclass(frozen=True)
class DriverCards:
    """What one driver's ResourceSlices publish: its largest card's memory and the largest
    total of one pool (a node's cards)."""

    largest_card_bytes: int
    largest_pool_bytes: int


CardMemory = Mapping[str, DriverCards]


class Unpriced(ValueError):
    """A claim's memory cannot be known: it needs a card's memory and no slice publishes one."""


class ClaimDemandError(ValueError):
    """A ResourceClaim's requests cannot be read (a bad quantity or count)."""


class ClaimBudgetLookupError(LookupError):
    """The namespace, its claims or the slices could not be read from the API server."""


def ask_bytes(ask: DeviceAsk, cards: CardMemory, where: str) -> int:
    if ask.count is not None and ask.memory_bytes is not None:
        return ask.count * ask.memory_bytes
    published = cards.get(ask.driver)
    if published is None or published.largest_card_bytes <= 0:
        raise Unpriced(
            f"{where} names no capacity.requests.memory, so it would take a whole card, and no "
            f"ResourceSlice of driver {ask.driver} publishes a card's memory to charge for it; "
            "name the memory it needs"
        )
    if ask.count is None:
        return published.largest_pool_bytes
    return ask.count * published.largest_card_bytes


def claim_bytes(demand: ClaimDemand, cards: CardMemory) -> int:
    """The GPU memory ``demand`` is charged (module docstring); raises :class:`Unpriced`."""
    total = 0
    for request in demand.requests:
        where = f"resourceclaim {demand.namespace}/{demand.name} request {request.name}"
        total += max(ask_bytes(a, cards, where) for a in request.alternatives)
    return total


class BudgetError(ValueError):
    """The namespace's budget label is not a quantity."""


def parse_budget(raw: str) -> int:
    """The label's value as bytes; raises :class:`BudgetError` naming the label and value."""
    try:
        amount = parse_quantity(raw)
    except RequestError as exc:
        raise BudgetError(
            f"label {BUDGET_LABEL}={raw!r:.80} is not a quantity of bytes such as 80Gi ({exc})"
        ) from None
    return math.floor(amount)


_UNITS = (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


def format_bytes(value: int) -> str:
    """``value`` in the largest binary unit it is a whole multiple of (``96Gi``, ``1536Mi``);
    otherwise in Gi with two decimals and the exact figure."""
    for suffix, size in _UNITS:
        if value and value % size == 0:
            return f"{value // size}{suffix}"
    if value < 1 << 30:
        return str(value)
    return f"{value / (1 << 30):.2f}Gi ({value} bytes)"


@dataclass(frozen=True)
class Verdict:
    """The webhook's answer for one claim: ``refusal`` is ``""`` when it is admitted.
    ``charged_bytes`` is what the claim was charged (0 when it asks no GPU memory or the
    namespace has no budget)."""

    refusal: str = ""
    charged_bytes: int = 0

    @property
    def allowed(self) -> bool:
        return not self.refusal


def budget_refusal(
    namespace: str, budget_raw: str, budget_bytes: int, held_bytes: int, asked_bytes: int
) -> str:
    """Why a claim of ``asked_bytes`` is refused in a namespace whose other claims hold
    ``held_bytes``, or ``""`` when it fits the budget."""
    total = held_bytes + asked_bytes
    if asked_bytes <= 0 or total <= budget_bytes:
        return ""
    return (
        f"namespace {namespace}: resource claims would hold {format_bytes(total)} of GPU "
        f"memory, over the budget of {budget_raw} (label {BUDGET_LABEL}): this claim asks for "
        f"{format_bytes(asked_bytes)} and the namespace's claims hold {format_bytes(held_bytes)}"
    )


class ClaimBudgetFacts(Protocol):
    """What the budget needs from the cluster. Each call may raise
    :class:`ClaimBudgetLookupError`."""

    async def budget_label(self, namespace: str) -> str | None:
        """The namespace's :data:`BUDGET_LABEL` value; None when it has none (or is gone)."""
        ...

    async def claims(self, namespace: str) -> list[ClaimDemand]:
        """The namespace's ResourceClaims as stored now (a consistent list)."""
        ...

    async def cards(self) -> CardMemory:
        """The cards the cluster's ResourceSlices publish, by driver."""
        ...

    def demand(self, claim: Mapping[str, object]) -> ClaimDemand:
        """A ResourceClaim's JSON read; raises :class:`ClaimDemandError`."""
        ...


@dataclass
class FakeClaimBudgetFacts:
    """:class:`ClaimBudgetFacts` from memory, scriptable: ``labels`` by namespace, ``stored``
    claims by namespace, ``published`` cards; ``decode`` reads a claim's JSON (tests pass the
    kube edge's reader); ``failure`` makes every read raise it; ``gate``, when set, is awaited
    by every :meth:`claims` call (to hold lists open while concurrent creates arrive)."""

    decode: Callable[[Mapping[str, object]], ClaimDemand]
    labels: dict[str, str] = field(default_factory=dict)
    stored: dict[str, list[ClaimDemand]] = field(default_factory=dict)
    published: dict[str, DriverCards] = field(default_factory=dict)
    failure: str = ""
    lists: int = 0
    gate: Callable[[], Awaitable[object]] | None = None

    def _check(self) -> None:
        if self.failure:
            raise ClaimBudgetLookupError(self.failure)

    async def budget_label(self, namespace: str) -> str | None:
        self._check()
        return self.labels.get(namespace)

    async def claims(self, namespace: str) -> list[ClaimDemand]:
        self._check()
        self.lists += 1
        if self.gate is not None:
            await self.gate()
        return list(self.stored.get(namespace, ()))

    async def cards(self) -> CardMemory:
        self._check()
        return dict(self.published)

    def demand(self, claim: Mapping[str, object]) -> ClaimDemand:
        return self.decode(claim)

    def store(self, claims: Iterable[ClaimDemand]) -> None:
        for c in claims:
            self.stored.setdefault(c.namespace, []).append(c)
