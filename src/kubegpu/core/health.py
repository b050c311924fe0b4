"""GPU health as domain values: what happened to a GPU and whether it makes the GPU unusable.

Which Xid codes count as critical is policy, kept here as data so that the NVML watcher, the
fake backend and the tests all apply the same rule. Its default follows NVIDIA's Xid catalog
(:mod:`kubegpu.core.xid_catalog`, docs/xid-policy.md); NVIDIA's device plugin's older rule is
the other choice a cluster can make (``health.xidPolicy``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kubegpu.core.gpu import GpuUuid
from kubegpu.core.xid_catalog import HEALTHY_CLASSES, XidClass, xid_meaning, xids_of

# Xids after which NVIDIA's catalog leaves the GPU in service: only the application restarts
# (RESTART_APP), or nothing needs doing (IGNORE, and 45, which follows another Xid).
CATALOG_IGNORED_XIDS: frozenset[int] = xids_of(*HEALTHY_CLASSES)
# Xids after which the catalog restarts the node (or re-seats the card): the GPU stays unhealthy
# until the agent restarts with the node, whatever it sees meanwhile.
NODE_REBOOT_XIDS: frozenset[int] = xids_of(XidClass.NODE_REBOOT)
# NVIDIA's device plugin's rule (its applicationErrorXids): 13 graphics engine exception, 31 GPU
# memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor
# exception, 109 context switch timeout pass; every other Xid is critical.
NVIDIA_DEVICE_PLUGIN_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

# The Xid rules a cluster starts from (``health.xidPolicy``): the Xids that pass, and those that
# need a node reboot.
XID_POLICIES: Mapping[str, tuple[frozenset[int], frozenset[int]]] = MappingProxyType(
    {
        "catalog": (CATALOG_IGNORED_XIDS, NODE_REBOOT_XIDS),
        "nvidia-device-plugin": (NVIDIA_DEVICE_PLUGIN_XIDS, frozenset()),
    }
)


class HealthEventKind(enum.Enum):
    XID = "xid"  # an Xid error was reported for the GPU
    LOST = "lost"  # the GPU fell off the bus / stopped answering
    RECOVERED = "recovered"  # a lost GPU answers again (fake backend, or a checked recovery)


@dataclass(frozen=True)
class HealthEvent:
    """Something the backend observed about one GPU (``uuid=None``: about every GPU)."""

    kind: HealthEventKind
    uuid: GpuUuid | None
    xid: int | None = None
    detail: str = ""
    # The MIG GPU instance (and compute instance) the event concerns on a card in MIG mode;
    # None: the whole card, which every MIG device on it shares.
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def concerns(self, gpu_instance_id: int, compute_instance_id: int) -> bool:
        """Whether this event reaches the MIG device with these ids: an event on the whole
        card reaches every instance; one naming an instance reaches only that one."""
        if self.gpu_instance_id is None:
            return True
        if self.gpu_instance_id != gpu_instance_id:
            return False
        return self.compute_instance_id is None or self.compute_instance_id == compute_instance_id


# What well-known Xids mean, for log lines and unhealthy reasons an admin can act on, in the
# words kubegpu has always logged; others take the catalog's. Not a policy input: an Xid missing
# here is still judged by :class:`HealthCheckPolicy`.
XID_DESCRIPTIONS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def describe_xid(xid: int | None) -> str:
    """``"Xid 79 (GPU has fallen off the bus)"``; unknown codes keep just the number."""
    if xid is None:
        return "Xid (code unknown)"
    meaning = XID_DESCRIPTIONS.get(xid) or xid_meaning(xid)
    return f"Xid {xid} ({meaning})" if meaning else f"Xid {xid}"


def describe_event(event: HealthEvent) -> str:
    """A one-line reason for logs and for the device plugin's unhealthy message."""
    if event.kind is HealthEventKind.XID:
        text = describe_xid(event.xid)
    elif event.kind is HealthEventKind.LOST:
        text = "GPU lost (not answering; fallen off the bus?)"
    else:
        text = "GPU answers again"
    return f"{text}: {event.detail}" if event.detail else text


# Tokens NVIDIA's plugin treats as "every Xid" in DP_DISABLE_HEALTHCHECKS/DP_ENABLE_HEALTHCHECKS.
_ALL_TOKENS = frozenset({"all", "xids"})


@dataclass(frozen=True)
class HealthCheckPolicy:
    """Which health events make a GPU unusable, and whether it may come back on its own.

    Precedence follows NVIDIA's device plugin: an Xid explicitly enabled (or "enable all") is
    critical even when ignored by default or disabled; otherwise an Xid that is ignored, disabled,
    or covered by "disable all" is not critical; every other Xid is critical. A critical Xid in
    ``reboot_xids`` keeps its GPU unhealthy until the agent restarts (with the node).
    """

    disabled: bool = False  # no health checking at all (nothing is watched)
    ignored_xids: frozenset[int] = CATALOG_IGNORED_XIDS
    reboot_xids: frozenset[int] = NODE_REBOOT_XIDS
    disabled_xids: frozenset[int] = frozenset()  # extra Xids to ignore
    all_xids_disabled: bool = False  # "disable all" with an enable list: an allow-list
    enabled_xids: frozenset[int] = frozenset()  # critical whatever the lists above say
    all_xids_enabled: bool = False
    # None: an unhealthy GPU stays unhealthy until the agent restarts (NVIDIA's behaviour,
    # because a flapping GPU that fails jobs is worse than one taken out of the pool).
    recover_after_healthy_checks: int | None = None

    def __post_init__(self) -> None:
        if self.recover_after_healthy_checks is not None and self.recover_after_healthy_checks < 1:
            raise ValueError(
                "recover_after_healthy_checks must be at least 1 or None, "
                f"got {self.recover_after_healthy_checks}"
            )

    @classmethod
    def from_nvidia_env(
        cls,
        env: Mapping[str, str],
        *,
        recover_after_healthy_checks: int | None = None,
        xid_policy: str = "catalog",
    ) -> HealthCheckPolicy:
        """Read ``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` as NVIDIA documents them,
        on top of the Xid rule ``xid_policy`` names (a key of :data:`XID_POLICIES`).

        ``DP_DISABLE_HEALTHCHECKS``: ``all`` or ``xids`` disables health checking, a comma list
        adds Xids to the ignore list. ``DP_ENABLE_HEALTHCHECKS``: a comma list (or ``all``) of
        Xids that are critical whatever else says; with ``DP_DISABLE_HEALTHCHECKS=all`` it is an
        allow-list. Unlike NVIDIA's plugin, which drops tokens it cannot parse, a bad token is a
        ``ValueError`` naming it: a typo must not silently change which GPUs leave the pool.
        """
        if xid_policy not in XID_POLICIES:
            raise ValueError(
                f"unknown Xid policy {xid_policy!r} (expected one of {', '.join(XID_POLICIES)})"
            )
        ignored, reboot = XID_POLICIES[xid_policy]
        disable_all, disabled = _parse_xid_list("DP_DISABLE_HEALTHCHECKS", env)
        enable_all, enabled = _parse_xid_list("DP_ENABLE_HEALTHCHECKS", env)
        anything_enabled = enable_all or bool(enabled)
        return cls(
            disabled=disable_all and not anything_enabled,
            ignored_xids=ignored,
            reboot_xids=reboot,
            disabled_xids=disabled,
            all_xids_disabled=disable_all,
            enabled_xids=enabled,
            all_xids_enabled=enable_all,
            recover_after_healthy_checks=recover_after_healthy_checks,
        )

    def is_xid_critical(self, xid: int | None) -> bool:
        if self.disabled:
            return False
        if xid is None:
            # An Xid event whose code could not be read: assume the worst, as NVIDIA does for
            # events it cannot attribute.
            return True
        if self.all_xids_enabled or xid in self.enabled_xids:
            return True
        return not (self.all_xids_disabled or xid in self.disabled_xids or xid in self.ignored_xids)

    def is_critical(self, event: HealthEvent) -> bool:
        """Whether ``event`` makes its GPU unusable under this policy."""
        if self.disabled:
            return False
        if event.kind is HealthEventKind.LOST:
            # A GPU that stopped answering is unusable whatever the Xid lists say; only turning
            # health checks off entirely ignores it.
            return True
        if event.kind is HealthEventKind.RECOVERED:
            return False
        return self.is_xid_critical(event.xid)

    def needs_node_reboot(self, event: HealthEvent) -> bool:
        """Whether ``event`` is a critical Xid after which only a node restart brings the GPU
        back: neither quiet checks nor the GPU answering again clear it (NVIDIA's catalog:
        RESTART_BM for Xid 79, a GPU that answers again after falling off the bus is not
        trusted until the node restarts)."""
        return (
            event.kind is HealthEventKind.XID
            and event.xid in self.reboot_xids
            and self.is_critical(event)
        )


def _parse_xid_list(name: str, env: Mapping[str, str]) -> tuple[bool, frozenset[int]]:
    raw = env.get(name, "")
    everything = False
    xids: set[int] = set()
    for token in (part.strip().lower() for part in raw.split(",")):
        if not token:
            continue
        if token in _ALL_TOKENS:
            everything = True
            continue
        try:
            xid = int(token)
        except ValueError:
            raise ValueError(
                f"{name}={raw!r}: {token!r} is neither an Xid number nor one of 'all', 'xids'"
            ) from None
        if xid <= 0:
            raise ValueError(f"{name}={raw!r}: Xid {xid} is not a positive number")
        xids.add(xid)
    return everything, frozenset(xids)
