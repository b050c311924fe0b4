"""GPU resource names and units, and the conversion of a pod's JSON into what it asks for.

Whole cards stay ``nvidia.com/gpu``. A *share* of one card is asked for with three names: GPU
memory in MiB and compute in milli-GPU (1000 = one card), both accounted only by the scheduler
extender (nodes never advertise them, so the kubelet drops them at admission), plus one share
slot, which the node agent does advertise so that the kubelet calls its ``Allocate`` for the
container (see ``docs/sharing.md`` for why the slot exists and why it stays small).

The pod arithmetic follows kube-scheduler's (``PodRequests`` in k8s.io/component-helpers):
effective request = max(sum over app containers + sidecars, the largest init-container
step), plus ``spec.overhead``. Everything here is pure: pod JSON in, our values out.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from kubegpu.core.names import model_key
from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.sharing.peers import PeerCompat

DEFAULT_WHOLE_GPU = "nvidia.com/gpu"
DEFAULT_GPU_MEMORY = "kubegpu.io/gpu-memory"  # MiB of one card's memory
DEFAULT_GPU_COMPUTE = "kubegpu.io/gpu-compute"  # milli-GPU of one card, 1..999 (1000 = whole)
DEFAULT_SHARE_SLOT = "kubegpu.io/gpu-shared"  # one per sharing container; advertised per card
# Pod annotation narrowing the card models a pod accepts: "A100-SXM4-80GB,H100-80GB".
GPU_MODELS_ANNOTATION = "kubegpu.io/gpu-models"


@dataclass(frozen=True)
class ResourceNames:
    """The extended-resource names in use; configurable because clusters already running
    another sharing system may have taken the defaults."""

    whole_gpu: str = DEFAULT_WHOLE_GPU
    gpu_memory: str = DEFAULT_GPU_MEMORY
    gpu_compute: str = DEFAULT_GPU_COMPUTE
    share_slot: str = DEFAULT_SHARE_SLOT
    # Compat modes: a peer's memory resource read as a share (kubegpu.sharing.peers).
    peers: tuple[PeerCompat, ...] = ()

    def __post_init__(self) -> None:
        names = (
            self.whole_gpu,
            self.gpu_memory,
            self.gpu_compute,
            self.share_slot,
            *(p.memory_resource for p in self.peers),
            *(p.count_resource for p in self.peers),
        )
        if len(set(names)) != len(names):
            raise ValueError(f"GPU resource names must be distinct, got {names}")
        for name in names:
            if not _EXTENDED_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid extended resource name (domain/name)")

    @property
    def all(self) -> tuple[str, ...]:
        return (self.whole_gpu, self.gpu_memory, self.gpu_compute, self.share_slot)

    @property
    def peer_memory(self) -> tuple[str, ...]:
        """The peers' memory resources a pod may ask for in compat mode."""
        return tuple(p.memory_resource for p in self.peers)


_EXTENDED_NAME = re.compile(
    r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


class RequestError(ValueError):
    """The pod's GPU request cannot be served; the message says why and what to change."""


class RequestKind(enum.Enum):
    NONE = "none"  # no GPU resource at all: the extender passes it through untouched
    WHOLE = "whole"  # nvidia.com/gpu cards
    SHARED = "shared"  # memory + compute on one card


@dataclass(frozen=True)
class ContainerShare:
    """What one container asks of the GPU. ``init`` containers run before the app ones;
    ``sidecar`` (restartable init) containers run alongside them."""

    name: str
    init: bool = False
    sidecar: bool = False
    whole_gpus: int = 0
    compute_milli: int = 0
    gpu_memory_mib: int = 0
    share_slots: int = 0
    peer: str = ""  # the compat mode whose memory resource the container asks for
    peer_units: int = 0  # that amount, in the peer's unit


@dataclass(frozen=True)
class GpuRequest:
    """A pod's effective demand: node CPU/memory, and cards (whole) or one card's share."""

    kind: RequestKind
    cpu_milli: int
    host_memory_mib: int
    whole_gpus: int = 0
    compute_milli: int = 0
    gpu_memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()
    containers: tuple[ContainerShare, ...] = field(default=())
    name: str = ""

    def to_placement(self) -> PodRequest:
        """The placement engine's view of this request."""
        if self.kind is RequestKind.WHOLE:
            return PodRequest(
                self.cpu_milli,
                self.host_memory_mib,
                self.whole_gpus,
                MILLI_PER_GPU,
                None,
                self.gpu_models,
                self.name,
            )
        if self.kind is RequestKind.SHARED:
            return PodRequest(
                self.cpu_milli,
                self.host_memory_mib,
                1,
                self.compute_milli,
                self.gpu_memory_mib,
                self.gpu_models,
                self.name,
            )
        return PodRequest(self.cpu_milli, self.host_memory_mib, name=self.name)


# --------------------------------------------------------------------------- quantities
_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(
    r"([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?"
)
_MIB = Decimal(2) ** 20


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity ("500m", "10Gi", "1e3", 4) as an exact decimal; raises
    :class:`RequestError` for anything kube-apiserver would not accept."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RequestError(f"quantity must be a string or number, got {value!r}")
    text = str(value).strip()
    match = _QUANTITY.fullmatch(text)
    if match is None or len(text) > 64:
        raise RequestError(f"{text[:64]!r} is not a Kubernetes quantity")
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number)
        amount *= Decimal(f"1{exponent}") if exponent else _SUFFIX[suffix or ""]
    except (InvalidOperation, OverflowError):
        raise RequestError(f"{text!r} is not a Kubernetes quantity") from None
    if amount < 0:
        raise RequestError(f"quantity {text!r} is negative")
    if amount > Decimal(10) ** 18:
        raise RequestError(f"quantity {text!r} is too large")
    return amount


def _quantity_in(raw: object, where: str, name: str) -> Decimal:
    try:
        return parse_quantity(raw)
    except RequestError as exc:
        raise RequestError(f"{where}: {name}: {exc}") from None


def _ceil(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=ROUND_CEILING))


# --------------------------------------------------------------------------- pods
_AMOUNTS = (
    "cpu_milli",
    "host_memory_mib",
    "whole_gpus",
    "compute_milli",
    "gpu_memory_mib",
    "share_slots",
)


@dataclass(frozen=True)
class PodTotals:
    """Requests as kube-scheduler adds them up, unvalidated: one container's, a sum of some,
    or (from :func:`pod_totals`) the pod's effective totals with its per-container GPU split in
    ``containers``. Host memory and GPU memory are different resources, hence the names."""

    cpu_milli: int = 0
    host_memory_mib: int = 0
    whole_gpus: int = 0
    compute_milli: int = 0
    gpu_memory_mib: int = 0
    share_slots: int = 0
    containers: tuple[ContainerShare, ...] = ()

    def plus(self, other: PodTotals) -> PodTotals:
        return PodTotals(*(getattr(self, f) + getattr(other, f) for f in _AMOUNTS))

    def max(self, other: PodTotals) -> PodTotals:
        return PodTotals(*(max(getattr(self, f), getattr(other, f)) for f in _AMOUNTS))


def _container_amounts(container: Mapping[str, Any], names: ResourceNames, where: str) -> PodTotals:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise RequestError(f"{where}: resources must be an object")
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
        raise RequestError(f"{where}: resources.requests and .limits must be objects")

    def amount(name: str, extended: bool) -> Decimal:
        # Extended resources: requests default to limits and must equal them (API validation);
        # CPU/memory requests default to limits too (API defaulting).
        raw = requests.get(name, limits.get(name))
        if raw is None:
            return Decimal(0)
        try:
            value = parse_quantity(raw)
        except RequestError as exc:
            raise RequestError(f"{where}: {name}: {exc}") from None
        both = extended and name in limits and name in requests
        if both and _quantity_in(limits[name], where, name) != value:
            raise RequestError(f"{where}: {name}: request and limit must be equal")
        if extended and value != value.to_integral_value():
            raise RequestError(f"{where}: {name} must be a whole number, got {raw!r}")
        return value

    compute_milli = int(amount(names.gpu_compute, True))
    gpu_memory_mib = int(amount(names.gpu_memory, True))
    for peer in names.peers:
        if int(amount(peer.count_resource, True)):
            raise RequestError(
                f"{where}: {peer.count_resource} is a node figure in {peer.name} compat mode, not "
                f"something to ask for; ask for {peer.memory_resource} for a share or "
                f"{names.whole_gpu} for whole cards"
            )
        units = int(amount(peer.memory_resource, True))
        if not units:
            continue
        if gpu_memory_mib or compute_milli:
            raise RequestError(
                f"{where}: asks for {peer.memory_resource} and {names.gpu_memory}/"
                f"{names.gpu_compute} at once; use one or the other"
            )
        # The peer's memory is a share of one card with a fixed compute part (the peers
        # reserve none; kubegpu.sharing.peers says why the default is one milli-GPU).
        gpu_memory_mib = units * peer.memory_unit_mib
        compute_milli = peer.compute_milli
    return PodTotals(
        cpu_milli=_ceil(amount("cpu", False) * 1000),
        host_memory_mib=_ceil(amount("memory", False) / _MIB),
        whole_gpus=int(amount(names.whole_gpu, True)),
        compute_milli=compute_milli,
        gpu_memory_mib=gpu_memory_mib,
        share_slots=int(amount(names.share_slot, True)),
    )


def _peer_ask(container: Mapping[str, Any], names: ResourceNames) -> tuple[str, int]:
    """The compat mode a container's GPU memory is asked in, and the amount in its unit."""
    resources = container.get("resources")
    if not names.peers or not isinstance(resources, Mapping):
        return "", 0
    for peer in names.peers:
        for part in ("limits", "requests"):
            amounts = resources.get(part)
            if isinstance(amounts, Mapping) and peer.memory_resource in amounts:
                units = int(parse_quantity(amounts[peer.memory_resource]))
                if units:
                    return peer.name, units
    return "", 0


def _containers(spec: Mapping[str, Any], key: str) -> Sequence[Mapping[str, Any]]:
    items = spec.get(key) or []
    if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
        raise RequestError(f"spec.{key} must be a list of objects")
    return items


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    if not isinstance(meta, Mapping):
        return "<pod without metadata>"
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"


def pod_totals(pod: Mapping[str, Any], names: ResourceNames | None = None) -> PodTotals:
    """Effective requests as kube-scheduler computes them; raises :class:`RequestError` only
    for JSON it cannot read (bad quantities, wrong shapes)."""
    names = names or ResourceNames()
    key = pod_key(pod)
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        raise RequestError(f"pod {key}: no spec")
    shares: list[ContainerShare] = []
    app = PodTotals()
    for index, container in enumerate(_containers(spec, "containers")):
        cname = str(container.get("name") or f"#{index}")
        amounts = _container_amounts(container, names, f"pod {key} container {cname}")
        app = app.plus(amounts)
        shares.append(
            _split(cname, amounts, init=False, sidecar=False, peer=_peer_ask(container, names))
        )
    sidecars = PodTotals()
    init_peak = PodTotals()
    for index, container in enumerate(_containers(spec, "initContainers")):
        cname = str(container.get("name") or f"init#{index}")
        amounts = _container_amounts(container, names, f"pod {key} init container {cname}")
        sidecar = container.get("restartPolicy") == "Always"
        if sidecar:
            app = app.plus(amounts)
            sidecars = sidecars.plus(amounts)
            step = sidecars
        else:
            step = amounts.plus(sidecars)
        init_peak = init_peak.max(step)
        shares.append(
            _split(cname, amounts, init=True, sidecar=sidecar, peer=_peer_ask(container, names))
        )
    total = app.max(init_peak)
    overhead = spec.get("overhead") or {}
    if isinstance(overhead, Mapping) and overhead:
        extra = _container_amounts({"resources": {"requests": overhead}}, names, f"pod {key}")
        total = total.plus(
            PodTotals(cpu_milli=extra.cpu_milli, host_memory_mib=extra.host_memory_mib)
        )
    return replace(total, containers=tuple(shares))


def _split(
    cname: str,
    amounts: PodTotals,
    *,
    init: bool,
    sidecar: bool,
    peer: tuple[str, int] = ("", 0),
) -> ContainerShare:
    return ContainerShare(
        cname,
        init=init,
        sidecar=sidecar,
        whole_gpus=amounts.whole_gpus,
        compute_milli=amounts.compute_milli,
        gpu_memory_mib=amounts.gpu_memory_mib,
        share_slots=amounts.share_slots,
        peer=peer[0],
        peer_units=peer[1],
    )


def gpu_request(pod: Mapping[str, Any], names: ResourceNames | None = None) -> GpuRequest:
    """What ``pod`` (Kubernetes JSON) asks for; raises :class:`RequestError` with an actionable
    message for requests that cannot be served."""
    names = names or ResourceNames()
    return request_from_totals(pod, pod_totals(pod, names), names)


def request_from_totals(
    pod: Mapping[str, Any], totals: PodTotals, names: ResourceNames
) -> GpuRequest:
    """The servable request behind ``totals`` (``pod`` gives its key and model list); raises
    :class:`RequestError` with an actionable message for requests that cannot be served."""
    key = pod_key(pod)
    models = _models(pod, key)
    shared = totals.compute_milli > 0 or totals.gpu_memory_mib > 0 or totals.share_slots > 0
    if totals.whole_gpus > 0 and shared:
        raise RequestError(
            f"pod {key} asks for whole GPUs ({names.whole_gpu}) and a GPU share "
            f"({names.gpu_memory}/{names.gpu_compute}/{names.share_slot}) at once; "
            "use one or the other"
        )
    if totals.whole_gpus > 0:
        return GpuRequest(
            RequestKind.WHOLE,
            whole_gpus=totals.whole_gpus,
            gpu_models=models,
            containers=totals.containers,
            cpu_milli=totals.cpu_milli,
            host_memory_mib=totals.host_memory_mib,
            name=key,
        )
    if not shared:
        return GpuRequest(RequestKind.NONE, totals.cpu_milli, totals.host_memory_mib, name=key)
    for share in totals.containers:
        _check_share(share, names, key)
    if totals.compute_milli >= MILLI_PER_GPU:
        raise RequestError(
            f"pod {key} asks for {totals.compute_milli} milli-GPU of shared compute; a share must "
            f"fit on one card (at most {MILLI_PER_GPU - 1}); ask for {names.whole_gpu} instead"
        )
    return GpuRequest(
        RequestKind.SHARED,
        compute_milli=totals.compute_milli,
        gpu_memory_mib=totals.gpu_memory_mib,
        gpu_models=models,
        containers=totals.containers,
        cpu_milli=totals.cpu_milli,
        host_memory_mib=totals.host_memory_mib,
        name=key,
    )


def _check_share(share: ContainerShare, names: ResourceNames, key: str) -> None:
    where = f"pod {key} container {share.name}"
    has_share = share.compute_milli > 0 or share.gpu_memory_mib > 0
    if has_share and not (share.compute_milli and share.gpu_memory_mib):
        raise RequestError(
            f"{where}: a GPU share needs both {names.gpu_memory} (MiB) and "
            f"{names.gpu_compute} (milli-GPU)"
        )
    if has_share and share.share_slots != 1:
        hint = (
            f" (it asks in {share.peer} compat mode: is kubegpu's peer webhook installed, which "
            "adds the slot?)"
            if share.peer
            else ""
        )
        raise RequestError(
            f"{where}: a container with a GPU share must also ask for exactly 1 "
            f"{names.share_slot} (got {share.share_slots}); without it the node agent is never "
            f"asked to give the container its card{hint}"
        )
    if share.share_slots and not has_share:
        raise RequestError(
            f"{where}: {names.share_slot} without {names.gpu_memory} and {names.gpu_compute}; "
            "say how much of the card the container needs"
        )


def _models(pod: Mapping[str, Any], key: str) -> frozenset[str]:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return frozenset()
    raw = annotations.get(GPU_MODELS_ANNOTATION)
    if raw is None:
        return frozenset()
    if not isinstance(raw, str):
        raise RequestError(f"pod {key}: annotation {GPU_MODELS_ANNOTATION} must be a string")
    names = [m.strip() for m in raw.split(",") if m.strip()]
    if not names:
        raise RequestError(f"pod {key}: annotation {GPU_MODELS_ANNOTATION} names no model")
    # NVML's name or the label's (``Tesla T4`` / ``Tesla-T4``): both mean the same cards.
    models = frozenset(model_key(m) for m in names)
    if "" in models:
        bad = next(m for m in names if not model_key(m))
        raise RequestError(
            f"pod {key}: annotation {GPU_MODELS_ANNOTATION}: {bad!r} is not a GPU model name"
        )
    return models
