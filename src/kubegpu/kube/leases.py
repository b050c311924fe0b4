"""Leases and API errors over lightkube, for the extender's leader gate.

:class:`LightkubeLeases` is the real :class:`~kubegpu.extender.leader.LeaseReader`;
:func:`unavailable_as_core` makes any API call's failure (an ``ApiError`` answer, or no answer:
an ``httpx`` error) the core's :class:`~kubegpu.core.apiserver.ApiUnavailable`, so the extender
edge can react to it without importing lightkube.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import httpx2 as httpx
import lightkube
from lightkube import ApiError
from lightkube.resources.coordination_v1 import Lease

from kubegpu.core.apiserver import ApiUnavailable, LeaseState

P = ParamSpec("P")
T = TypeVar("T")


class LightkubeLeases:
    def __init__(self, client: lightkube.AsyncClient) -> None:
        self.client = client

    async def read_lease(self, namespace: str, name: str) -> LeaseState:
        try:
            lease = await self.client.get(Lease, name, namespace=namespace)
        except ApiError as exc:
            raise ApiUnavailable(exc.status.message) from exc
        except httpx.HTTPError as exc:
            raise ApiUnavailable(str(exc)) from exc
        spec = lease.spec
        if spec is None:
            return LeaseState()
        return LeaseState(spec.holderIdentity or "", spec.renewTime, spec.leaseDurationSeconds)


def unavailable_as_core(
    call: Callable[P, Awaitable[T]],
) -> Callable[P, Awaitable[T]]:
    """``call`` with lightkube's and httpx's failures raised as ``ApiUnavailable`` (same text)."""

    @functools.wraps(call)
    async def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await call(*args, **kwargs)
        except (ApiError, httpx.HTTPError) as exc:
            raise ApiUnavailable(str(exc)) from exc

    return wrapped
