"""kubelet edge: device plugin and podresources gRPC APIs, registration and lifecycle.

* ``resources`` — what each resource advertises (whole GPUs, time-slicing replicas, card-level
  share slots ``<uuid>::slot-<n>``) and how a plain ``Allocate`` is answered;
* ``plugin`` — the gRPC servicer and server, and the health board (health plus ids withdrawn
  because their card is in use the other way, whole vs shared);
* ``agent`` — the supervisor: servers, registration, reloads, health monitor, the node
  inventory annotation, the sharing coordinator, the MPS daemon and (``exporter.enabled``) the
  Prometheus exporter fed by its health monitor;
* ``channels`` — client channels to re-created unix sockets (subchannels of their own, so a
  fresh channel dials the new socket instead of waiting out the old one's backoff);
* ``shares`` / ``coordinator`` / ``cluster`` — card-level sharing (``sharing.gpuShare``):
  the pure matching rules and ledger codec, the coordinator answering Allocate from the
  extender's decisions and reconciling with PodResources, and its API / PodResources edges.

Annotations the node agent writes: ``kubegpu.io/gpu-inventory`` on its Node (every card's
UUID, index, model, memory, health), and on sharing pods ``kubegpu.io/gpu-allocated`` (which
container got which card and slot, when, and whether PodResources confirmed it) and, when
reconciliation had to repair something, ``kubegpu.io/gpu-drift`` (what and when). It also moves
a shared pod's ``kubegpu.io/gpu-allocation`` to the card the kubelet really gave it.
"""
