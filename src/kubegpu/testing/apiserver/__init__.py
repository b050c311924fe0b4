"""A fake Kubernetes API server that speaks the real HTTP API, for tests and demos.

It serves nodes, pods (with the binding and status subresources), namespaces, events,
configmaps, resourcequotas, leases and poddisruptionbudgets with kube-apiserver's semantics:
one global resourceVersion, 409 on stale writes, label and field selectors, watch streams that
resume from a version or answer 410 Expired, merge / strategic / JSON patches and ``Status``
errors. Point a real client (lightkube) at it; nothing is mocked. Test hooks (direct store
access, request counters, injected failures, dropped watches) sit beside it.

Typical use::

    async with FakeApiServer() as server:          # or: with FakeApiServer().run_in_thread()
        server.store.put("nodes", make_node("node-a", extended={"nvidia.com/gpu": "8"}))
        client = server.async_client()             # lightkube.AsyncClient, plain HTTP
        ...
        server.inject_failures("pods", "p1", code=409)   # the next write to p1 conflicts
        server.drop_watches()                            # clients must re-watch

Like kube-apiserver, a pods/binding POST answers with a ``v1.Status``, which lightkube's typed
``PodBinding`` fails to decode (``msgspec.ValidationError``) after the bind happened; post the
binding through a dict-typed resource class instead (see the tests).
"""

from kubegpu.testing.apiserver.errors import StatusError
from kubegpu.testing.apiserver.objects import make_namespace, make_node, make_pod
from kubegpu.testing.apiserver.server import FakeApiServer, RequestRecord
from kubegpu.testing.apiserver.server_thread import ServerThread
from kubegpu.testing.apiserver.store import ChangeEvent, Store

__all__ = [
    "ChangeEvent",
    "FakeApiServer",
    "RequestRecord",
    "ServerThread",
    "StatusError",
    "Store",
    "make_namespace",
    "make_node",
    "make_pod",
]
