"""Preparing and unpreparing claims on this node: the logic behind the DRA gRPC handlers.

Idempotent by construction: a claim already in the checkpoint is answered from it (no second
API read, no second share); Unprepare of a claim we never prepared succeeds. Order of effects
on Prepare: CDI spec first, then the checkpoint entry, so a crash in between leaves at worst a
spec that the repeated Prepare overwrites. On Unprepare: spec removed first, then the entry, so
a crash leaves an entry whose repeated Unprepare finishes the job.

Per claim, never per call: the kubelet sends every claim of a pod in one call, and one claim
that cannot be prepared (a bad name, an API error or no answer, a malformed object, a device
not ours, an opaque config it cannot honour, a CDI file that cannot be written) is that claim's
error while the others are prepared. The checkpoint is written once per call, after every
claim of it is done, so a call of N claims costs N API reads and N CDI specs but one checkpoint
file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kubegpu.core.backend import MigPartitioner
from kubegpu.core.dra import (
    KUBEGPU_NAMING,
    WHOLE_CLAIM_REQUEST,
    ClaimAllocation,
    ClaimRef,
    DraNaming,
    PreparedClaim,
    PreparedDevice,
    device_index,
    mig_placement,
)
from kubegpu.core.dra_ports import ClaimLookupError, ResourceClaimSource
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra import cdi
from kubegpu.dra.checkpoint import Checkpoint, CheckpointError
from kubegpu.dra.claim_configs import ConfigRefused, apply_configs
from kubegpu.dra.mig_instances import MigInstances, MigPrepareError
from kubegpu.dra.slices import holds_whole_card, pool_name
from kubegpu.sharing.contract import ShareSettings

log = logging.getLogger(__name__)


class PrepareError(RuntimeError):
    """This claim cannot be prepared on this node (reported per claim, not for the call)."""


@dataclass(frozen=True)
class DriverSettings:
    node_name: str
    cdi_dir: Path
    checkpoint_path: Path
    naming: DraNaming = KUBEGPU_NAMING
    cdi_kind: str | None = None  # default: "<driver>/claim"
    dev_root: str = "/"
    # The config's `dra` section: under `enforcement: mps` shares are prepared as clients of
    # the driver's MPS daemon.
    shares: ShareSettings = cdi.UNENFORCED
    # `dra.mig: dynamic`: cards in MIG mode offer every placement (partitionable devices) and
    # the instance is created on prepare, destroyed on unprepare.
    dynamic_mig: bool = False

    @property
    def driver(self) -> str:
        return self.naming.driver

    @property
    def kind(self) -> str:
        return self.cdi_kind or cdi.default_kind(self.driver)


# A claim's outcome in a call: what it was prepared into, or why not (one line).
Outcome = PreparedClaim | PrepareError


class ClaimPreparer:
    """Owns the checkpoint and the per-claim CDI specs of one node."""

    def __init__(
        self,
        settings: DriverSettings,
        inventory: NodeInventory,
        claims: ResourceClaimSource,
        checkpoint: Checkpoint | None = None,
        partitioner: MigPartitioner | None = None,
    ) -> None:
        self.settings = settings
        self.inventory = inventory
        self.claims = claims
        self.mig = MigInstances(
            settings.node_name, inventory, partitioner, dynamic=settings.dynamic_mig
        )
        # Raises CheckpointError for a file it cannot trust (the role exits 1 on it).
        self.checkpoint = checkpoint or Checkpoint(settings.checkpoint_path)
        # One call at a time: the checkpoint is rewritten whole at the end of each.
        self._lock = asyncio.Lock()

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """Each claim's outcome by UID; never raises for one claim's failure."""
        async with self._lock:
            outcomes: dict[str, Outcome] = {}
            new: dict[str, PreparedClaim] = {}
            for claim in claims:
                if claim.uid in outcomes:
                    continue  # the same claim twice in one call: one answer
                try:
                    outcomes[claim.uid] = await self._prepare_one(claim, new)
                except Exception as exc:  # one claim's failure is its own, whatever it is
                    outcomes[claim.uid] = _claim_error(claim, "prepare", exc)
            if new:
                try:
                    self.checkpoint.update(put=new.values())
                except (OSError, CheckpointError) as exc:
                    # Their CDI specs stay: harmless, and the kubelet's retry rewrites them.
                    for uid in new:
                        outcomes[uid] = _claim_error(new[uid].claim, "prepare", exc)
                    return outcomes
                for prepared in new.values():
                    log.info(
                        "prepared claim %s on node %s: %s",
                        prepared.claim,
                        self.settings.node_name,
                        ", ".join(dict.fromkeys(d.device for d in prepared.devices))
                        or "no devices",
                    )
            return outcomes

    async def _prepare_one(self, claim: ClaimRef, new: dict[str, PreparedClaim]) -> PreparedClaim:
        """Prepare one claim into ``new`` (the checkpoint is written by the caller); raises
        PrepareError, ClaimLookupError, OSError, or (a bug) anything."""
        _check_ref(claim)
        done = self.checkpoint.get(claim.uid)
        if done is not None:
            log.info("claim %s already prepared, answering from the checkpoint", claim)
            return done
        try:
            allocation = await self.claims.allocation(claim, self.settings.driver)
        except ClaimLookupError as exc:
            raise PrepareError(f"claim {claim}: {exc}") from None
        try:
            # In a thread: creating a MIG instance (dynamic MIG) waits for the driver.
            resolved = await asyncio.to_thread(self._resolve, allocation)
            devices = apply_configs(resolved, allocation, self.settings.shares)
        except (ConfigRefused, MigPrepareError) as exc:
            raise PrepareError(
                f"claim {claim}: {exc}" if isinstance(exc, ConfigRefused) else str(exc)
            ) from None
        spec = cdi.claim_spec(
            claim.uid, devices, self.settings.kind, self.settings.dev_root, self.settings.shares
        )
        cdi.write_claim_spec(self.settings.cdi_dir, claim.uid, spec)
        answered = [
            PreparedDevice(
                request_names=(base_request(result.request),),
                pool=result.pool,
                device=result.device,
                cdi_device_ids=(cdi.qualified_name(self.settings.kind, claim.uid, result.device),),
                share_id=result.share_id,
            )
            for result in allocation.devices
        ]
        if cdi.needs_whole_claim_device(devices):
            # Last, so that its environment wins in a container naming the whole claim, and
            # under a request no container names, so that one naming a request never gets it.
            # It stands for the last device: the kubelet reports a device's health by name.
            last = answered[-1]
            answered.append(
                PreparedDevice(
                    request_names=(WHOLE_CLAIM_REQUEST,),
                    pool=last.pool,
                    device=last.device,
                    cdi_device_ids=(
                        cdi.qualified_name(self.settings.kind, claim.uid, cdi.WHOLE_CLAIM_DEVICE),
                    ),
                )
            )
        prepared = PreparedClaim(claim, tuple(answered))
        new[claim.uid] = prepared
        return prepared

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareError | None]:
        """Each claim's error by UID, None when it is unprepared (or never was prepared)."""
        async with self._lock:
            outcomes: dict[str, PrepareError | None] = {}
            gone: dict[str, tuple[ClaimRef, bool]] = {}  # uid -> (claim, had a spec or entry)
            for claim in claims:
                if claim.uid in outcomes:
                    continue
                try:
                    _check_ref(claim)
                    removed = cdi.remove_claim_spec(self.settings.cdi_dir, claim.uid)
                    held = self.checkpoint.get(claim.uid)
                    if held is not None:
                        # Dynamic MIG: the claim's instances go with it (before the entry, so
                        # a failure here is retried by the kubelet with the entry still there).
                        await asyncio.to_thread(
                            self.mig.release, claim, [d.device for d in held.devices]
                        )
                except MigPrepareError as exc:
                    outcomes[claim.uid] = _claim_error(claim, "unprepare", PrepareError(str(exc)))
                    continue
                except Exception as exc:  # one claim's failure is its own, whatever it is
                    outcomes[claim.uid] = _claim_error(claim, "unprepare", exc)
                    continue
                known = self.checkpoint.get(claim.uid) is not None
                gone[claim.uid] = (claim, known or removed)
                outcomes[claim.uid] = None
            try:
                self.checkpoint.update(remove=gone)
            except (OSError, CheckpointError) as exc:
                for uid, (claim, _) in gone.items():
                    outcomes[uid] = _claim_error(claim, "unprepare", exc)
                return outcomes
            for claim, had in gone.values():
                if had:
                    log.info("unprepared claim %s on node %s", claim, self.settings.node_name)
            return outcomes

    def _resolve(self, allocation: ClaimAllocation) -> list[cdi.ClaimDevice]:
        claim = allocation.claim
        own_pool = pool_name(self.settings.node_name)
        devices: list[cdi.ClaimDevice] = []
        by_index = {gpu.index: gpu for gpu in self.inventory.gpus}
        for result in allocation.devices:
            if result.pool != own_pool:
                raise PrepareError(
                    f"claim {claim}: device {result.device} is in pool {result.pool!r}, "
                    f"not this node's pool {own_pool!r}"
                )
            placement = mig_placement(result.device)
            if placement is not None:
                mig = self.mig.resolve(claim, result.device, placement)
                devices.append(
                    cdi.ClaimDevice(
                        name=result.device,
                        gpu=by_index[placement.index],
                        mig=mig,
                        requests=frozenset({base_request(result.request)}),
                    )
                )
                continue
            index = device_index(result.device)
            gpu = by_index.get(index) if index is not None else None
            if gpu is None:
                raise PrepareError(
                    f"claim {claim}: device {result.device!r} is not a GPU of node "
                    f"{self.settings.node_name}"
                )
            devices.append(
                cdi.ClaimDevice(
                    name=result.device,
                    gpu=gpu,
                    share_id=result.share_id,
                    memory_bytes=result.memory_bytes,
                    # None, not 0: a share that consumed no compute (under NVIDIA's naming a
                    # request naming only memory) has no compute limit, not a limit of 0 %.
                    compute_milli=result.compute_milli or None,
                    requests=frozenset({base_request(result.request)}),
                )
            )
        # The same card twice in one claim (two requests, two shares of it) is one CDI device
        # whose limits are the sum: the containers of the claim share one slice of that card.
        merged: dict[str, cdi.ClaimDevice] = {}
        for device in devices:
            seen = merged.get(device.name)
            merged[device.name] = device if seen is None else _merge(seen, device)
        return [_as_whole_if_all_consumed(d) for d in merged.values()]


def _as_whole_if_all_consumed(device: cdi.ClaimDevice) -> cdi.ClaimDevice:
    """The real allocator records a request that names no capacity with the policies' defaults
    as consumed capacity (the whole card): that is a whole GPU, not a share of all of it."""
    if not device.is_share or not holds_whole_card(
        device.gpu, device.memory_bytes, device.compute_milli
    ):
        return device
    return replace(device, memory_bytes=None, compute_milli=None)


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


def _merge(a: cdi.ClaimDevice, b: cdi.ClaimDevice) -> cdi.ClaimDevice:
    return cdi.ClaimDevice(
        name=a.name,
        gpu=a.gpu,
        share_id=a.share_id or b.share_id,
        memory_bytes=_sum(a.memory_bytes, b.memory_bytes),
        compute_milli=_sum(a.compute_milli, b.compute_milli),
        requests=a.requests | b.requests,
    )


def base_request(request: str) -> str:
    """``<request>/<subrequest>`` (a ``firstAvailable`` choice) → ``<request>``: containers name
    the parent request in ``resources.claims[].request``, and the kubelet matches
    ``request_names`` against that (upstream's kubeletplugin helper strips the same way)."""
    return request.split("/", 1)[0]


def _check_ref(claim: ClaimRef) -> None:
    problem = claim.problem()
    if problem is not None:
        raise PrepareError(f"claim {claim}: {problem}")


def _claim_error(claim: ClaimRef, verb: str, exc: Exception) -> PrepareError:
    """``exc`` as this claim's one-line error, logged once."""
    if isinstance(exc, PrepareError):
        error = exc
    elif isinstance(exc, OSError | CheckpointError):
        # The CDI dir or the checkpoint cannot be written: the kubelet retries the claim.
        error = PrepareError(f"claim {claim}: {exc}")
    else:
        # Not a failure we know of, so a bug: the traceback goes to the log, the claim fails
        # alone and the other claims of the call are served.
        log.error("cannot %s claim %s", verb, claim, exc_info=exc)
        return PrepareError(f"claim {claim}: internal error: {type(exc).__name__}: {exc}")
    log.warning("cannot %s claim %s: %s", verb, claim, error)
    return error
