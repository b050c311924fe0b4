"""A fake Kubernetes API server that speaks the real HTTP API, for tests and demos.

It serves nodes, pods (with the binding and status subresources), namespaces, events,
configmaps, resourcequotas and leases with kube-apiserver's semantics: one global
resourceVersion, 409 on stale writes, label and field selectors, watch streams that resume from
a version or answer 410 Expired, merge / strategic / JSON patches and ``Status`` errors. Point a
real client (lightkube) at it; nothing is mocked. Test hooks (direct store access, request
counters, injected failures, dropped watches) sit beside it.
"""

from kubegpu.testing.apiserver.errors import StatusError
from kubegpu.testing.apiserver.objects import make_namespace, make_node, make_pod
from kubegpu.testing.apiserver.server import FakeApiServer, RequestRecord, ServerThread
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
