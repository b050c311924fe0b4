"""An aiohttp app standing in for part of the Kubernetes API, served on a free loopback port,
with a lightkube client pointed at it: what the stand-ins of the tests (ResourceSlices and
ResourceClaims for the DRA driver, their list + watch for the extender) share."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import lightkube
from aiohttp import web
from lightkube.config.kubeconfig import KubeConfig

from kubegpu.testing.kubeconfig import kubeconfig_dict


@asynccontextmanager
async def lightkube_client_for(
    app: web.Application,
    *,
    before_close: Callable[[], None] | None = None,
    shutdown_timeout_s: float = 60.0,
) -> AsyncIterator[lightkube.AsyncClient]:
    """Serve ``app`` on 127.0.0.1 and yield a client of it. ``before_close`` runs first on the
    way out (e.g. to end the app's open watch streams, which would hold the shutdown)."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = KubeConfig.from_dict(kubeconfig_dict(f"http://127.0.0.1:{port}"))
    client = lightkube.AsyncClient(config, field_manager="kubegpu-test", trust_env=False)
    try:
        yield client
    finally:
        if before_close is not None:
            before_close()
        await client.close()
        await runner.cleanup()
