"""A fake API server on its own event loop in a daemon thread, for synchronous callers.

:class:`ServerThread` starts a :class:`~kubegpu.testing.apiserver.server.FakeApiServer` on a
loop of its own and forwards the test hooks to it thread-safely. Separate from the server, which
knows nothing of threads: it serves on whichever loop starts it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import lightkube
from lightkube.config.kubeconfig import KubeConfig

from kubegpu.testing.apiserver.store import Store

if TYPE_CHECKING:
    from kubegpu.testing.apiserver.server import FakeApiServer

T = TypeVar("T")


class ServerThread:
    """A :class:`FakeApiServer` running on its own event loop in a daemon thread."""

    def __init__(
        self, server: FakeApiServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread
    ) -> None:
        self.server = server
        self.loop = loop
        self._thread = thread

    @classmethod
    def start(cls, server: FakeApiServer, timeout_s: float = 10.0) -> ServerThread:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(server.start())
            except BaseException as error:  # reported to the starting thread below
                failure.append(error)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.close()

        thread = threading.Thread(target=run, name="fake-apiserver", daemon=True)
        thread.start()
        if not started.wait(timeout_s):
            raise RuntimeError("the fake API server did not start in time")
        if failure:
            raise failure[0]
        return cls(server, loop, thread)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def store(self) -> Store:
        return self.server.store

    def call(self, function: Callable[[], Awaitable[T]], timeout_s: float = 30.0) -> T:
        """Run a coroutine function on the server's loop and wait for its result."""

        async def runner() -> T:
            return await function()

        return asyncio.run_coroutine_threadsafe(runner(), self.loop).result(timeout_s)

    def client(self, namespace: str = "default", **kwargs: Any) -> lightkube.Client:
        return self.server.client(namespace, **kwargs)

    def kubeconfig(self, namespace: str = "default") -> KubeConfig:
        return self.server.kubeconfig(namespace)

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        return self.server.write_kubeconfig(path, namespace)

    def count(self, verb: str, resource: str | None = None) -> int:
        return self.server.count(verb, resource)

    def drop_watches(self, *, abrupt: bool = False) -> int:
        """Thread-safe: the streams end on the server's loop."""
        return self.server.drop_watches(abrupt=abrupt)

    def inject_failures(
        self,
        resource: str,
        name: str | None = None,
        *,
        namespace: str | None = None,
        count: int = 1,
        code: int = 409,
    ) -> None:
        self.server.inject_failures(resource, name, namespace=namespace, count=count, code=code)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.loop.is_closed() or not self._thread.is_alive():
            return
        self.call(self.server.stop, timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
