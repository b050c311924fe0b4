"""The one HTTP serving foundation under every listener kubegpu has: the extender's verbs and
metrics, the peer webhook, the exporter's ``/metrics`` and the node agent's and DRA driver's
probes (:mod:`kubegpu.probes`). Each listener is an aiohttp application served here under
:class:`HttpLimits`; what the defences are, and why:

* **A whole request head within** ``head_timeout_s`` of the connection opening (or of its last
  answer), the TLS handshake included. A client that dribbles its head a byte at a time is
  closed at that deadline, however busy it looks.
* **A whole body within** ``body_timeout_s`` of its head, at most ``max_body_bytes`` of it, and
  at most ``max_inflight_body_bytes`` held by all requests at once. The size limit is checked
  against the running total, so a missing, negative or false ``Content-Length`` cannot get
  round it; over it is 413, a full budget 503 (retry later), a late body 408. The body is read
  before the handler runs, so no handler ever waits on a client.
* **At most** ``max_connections`` **connections, and at most** ``max_connections_per_client``
  **from one address.** Past either the new connection is closed on arrival. The per-client
  cap is what keeps a listener answering others while one client holds every slot it may: a
  pod flooding the node agent's health port with half-open heads cannot starve the kubelet's
  probes (they come from another address).
* **JSON no deeper than** ``max_json_depth`` and never a 500 for input: :func:`json_body` turns
  malformed, too deep or wrongly typed JSON into a 400 naming what is wrong
  (:class:`BadRequest`), and a handler's own bug is a 500 without a traceback sent back.

Served either on the caller's event loop (:class:`HttpListener`, the extender) or on a loop of
its own in a daemon thread (:class:`HttpThread`): the node agent's liveness check must still
answer, with 503 and why, when the agent's loop is stuck, and the exporter and the webhook have
no loop at all.

Its parts: :mod:`.limits` (the limits, answers, JSON), :mod:`.intake` (the middlewares that
read bodies and catch exceptions), :mod:`.serving` (connection caps and the two ways to
serve). It belongs to no edge (aiohttp and the standard library only): the exporter, the kubelet and
DRA edges, the webhook and the extender all serve HTTP, and none may import another.
"""

from kubegpu.httpd.intake import BodyBudget, hardened_app
from kubegpu.httpd.limits import (
    BODY_KEY,
    BadRequest,
    HttpLimits,
    check_depth,
    decode_json,
    json_body,
    json_error,
    text_error,
    text_response,
)
from kubegpu.httpd.serving import HttpListener, HttpThread

__all__ = [
    "BODY_KEY",
    "BadRequest",
    "BodyBudget",
    "HttpLimits",
    "HttpListener",
    "HttpThread",
    "check_depth",
    "decode_json",
    "hardened_app",
    "json_body",
    "json_error",
    "text_error",
    "text_response",
]
