"""What the emulated device manager has seen and decided, and the queries and waits on it.

Registrations (accepted and rejected), each resource's device list and its history of updates,
the current plugin connection per resource, and allocations (the kubelet's checkpoint), all
under one lock whose condition wakes waiters on every change. :class:`DeviceManagerRecords` is
the base of :class:`~kubegpu.testing.kubelet.emulator.KubeletEmulator`: separate so the
query helpers tests use are read apart from the wire work that fills them in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from kubegpu.testing.kubelet.plugin_client import PluginEndpoint
from kubegpu.testing.kubelet.values import (
    Allocation,
    AllocationError,
    DeviceUpdate,
    Registration,
    RejectedRegistration,
    SeenDevice,
    UpdateSource,
)


class DeviceManagerRecords:
    """The device manager's state and the read side of the emulator (thread-safe)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._endpoints: dict[str, PluginEndpoint] = {}
        # Superseded endpoints: the kubelet does not close them; we do at stop/restart.
        self._retired: list[PluginEndpoint] = []
        self._registrations: list[Registration] = []
        self._rejected: list[RejectedRegistration] = []
        self._devices: dict[str, dict[str, SeenDevice]] = {}
        self._updates: dict[str, list[DeviceUpdate]] = {}
        self._allocations: dict[tuple[str, str, str], Allocation] = {}

    def _record_update(
        self,
        resource: str,
        devices: dict[str, SeenDevice],
        received: float,
        source: UpdateSource,
    ) -> None:
        updates = self._updates.setdefault(resource, [])
        update = DeviceUpdate(
            resource_name=resource,
            sequence=len(updates) + 1,
            received_at_monotonic_s=received,
            source=source,
            devices=dict(devices),
        )
        updates.append(update)
        self._devices[resource] = dict(devices)
        self._changed.notify_all()

    # -- queries ---------------------------------------------------------------------------

    @property
    def registrations(self) -> list[Registration]:
        """Every accepted registration, oldest first, across restarts."""
        with self._lock:
            return list(self._registrations)

    @property
    def rejected_registrations(self) -> list[RejectedRegistration]:
        with self._lock:
            return list(self._rejected)

    def registration(self, resource: str) -> Registration | None:
        """The current (newest) registration for ``resource``, if its endpoint is known."""
        with self._lock:
            endpoint = self._endpoints.get(resource)
            return endpoint.registration if endpoint is not None else None

    def is_connected(self, resource: str) -> bool:
        """A registered endpoint whose ListAndWatch stream has not ended."""
        with self._lock:
            endpoint = self._endpoints.get(resource)
            return endpoint is not None and not endpoint.stopped

    def resources(self) -> list[str]:
        with self._lock:
            return sorted(self._devices)

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        """The latest device list of ``resource`` (empty when unknown)."""
        with self._lock:
            return dict(self._devices.get(resource, {}))

    def updates(self, resource: str) -> list[DeviceUpdate]:
        """Every device-list change of ``resource``, oldest first."""
        with self._lock:
            return list(self._updates.get(resource, []))

    def update_count(self, resource: str) -> int:
        with self._lock:
            return len(self._updates.get(resource, []))

    def capacity(self, resource: str) -> int:
        """What the node would report as ``capacity[resource]``: all known devices."""
        return len(self.devices(resource))

    def allocatable(self, resource: str) -> int:
        """What the node would report as ``allocatable[resource]``: healthy devices."""
        return sum(state.healthy for state in self.devices(resource).values())

    def allocations(self) -> list[Allocation]:
        with self._lock:
            return list(self._allocations.values())

    def wait_for_registration(
        self, resource: str, timeout_s: float = 10.0, *, count: int = 1
    ) -> Registration:
        """Block until ``resource`` has been registered ``count`` times; returns that one."""

        def ready() -> bool:
            return sum(r.resource_name == resource for r in self._registrations) >= count

        self._wait(ready, timeout_s, lambda: f"registration #{count} of {resource}")
        with self._lock:
            matching = [r for r in self._registrations if r.resource_name == resource]
            return matching[count - 1]

    def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[Mapping[str, SeenDevice]], bool] = bool,
        timeout_s: float = 10.0,
        *,
        after_sequence: int | None = None,
    ) -> DeviceUpdate:
        """Block until the device list of ``resource`` satisfies ``predicate``.

        By default waits until the *current* list does and returns the latest update. With
        ``after_sequence`` returns the first update newer than that sequence number which
        satisfies it (for latency figures: take ``update_count`` before the event). The default
        predicate waits for a non-empty device list.
        """

        def find() -> DeviceUpdate | None:
            updates = self._updates.get(resource, [])
            if after_sequence is None:
                latest = updates[-1:]
                return latest[0] if latest and predicate(latest[0].devices) else None
            for update in updates:
                if update.sequence > after_sequence and predicate(update.devices):
                    return update
            return None

        self._wait(lambda: find() is not None, timeout_s, lambda: f"devices of {resource}")
        with self._lock:
            found = find()
        assert found is not None
        return found

    def _wait(self, ready: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not ready():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"timed out after {timeout_s:g}s waiting for {what()}; {self._describe()}"
                    )
                self._changed.wait(remaining)

    def _describe(self) -> str:
        accepted = [f"{r.resource_name}@{r.endpoint}" for r in self._registrations]
        rejected = [f"{r.resource_name}@{r.endpoint}: {r.error}" for r in self._rejected]
        counts = {res: len(devs) for res, devs in self._devices.items()}
        return f"registrations={accepted} rejected={rejected} devices={counts}"

    def _current_endpoint(self, resource: str) -> PluginEndpoint:
        with self._lock:
            endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise AllocationError(f"resource {resource} is not registered with the kubelet")
        if endpoint.stopped:
            raise AllocationError(f"endpoint {resource} has been stopped")
        return endpoint

    def _devices_to_allocate(
        self, resource: str, count: int, must_include: Sequence[str], pod_uid: str
    ) -> tuple[dict[str, SeenDevice], list[str], list[str]]:
        """The checks of the kubelet's ``devicesToAllocate`` (topology policy ``none``): the
        resource's devices, the must-include ids and the free healthy ids (sorted), or
        ``AllocationError`` when they cannot make ``count``."""
        with self._lock:
            devices = dict(self._devices.get(resource, {}))
            owner = {
                device_id: allocation.pod_uid
                for allocation in self._allocations.values()
                if allocation.resource_name == resource
                for device_id in allocation.device_ids
            }
        must = list(dict.fromkeys(must_include))
        for device_id in must:
            if device_id not in devices or not devices[device_id].healthy:
                raise AllocationError(
                    f"must-include device {device_id} is not a healthy {resource} device"
                )
            if owner.get(device_id, pod_uid) != pod_uid:
                raise AllocationError(f"must-include device {device_id} belongs to another pod")
        if len(must) > count:
            raise AllocationError(f"{len(must)} must-include devices but only {count} requested")
        if not any(state.healthy for state in devices.values()):
            raise AllocationError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        free = sorted(
            device_id
            for device_id, state in devices.items()
            if state.healthy and device_id not in owner and device_id not in must
        )
        needed = count - len(must)
        if needed > len(free):
            raise AllocationError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(free)}"
            )
        return devices, must, free
