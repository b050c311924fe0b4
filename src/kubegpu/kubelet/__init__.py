"""kubelet edge: device plugin and podresources gRPC APIs, registration and lifecycle.

* ``resources`` — what each resource advertises (whole GPUs, MIG devices, time-slicing
  replicas, card-level share slots ``<uuid>::slot-<n>``) and how a plain ``Allocate`` is
  answered; ``plans`` builds them from the config and the inventory, ``mig`` says under which
  resource a MIG device goes (NVIDIA's MIG strategies);
* ``plugin`` — the gRPC servicer and server; ``plugin_set`` — every resource's server, its
  socket claim and registration, and the probes' answers;
* ``board`` — what the ``ListAndWatch`` streams show: health read from the node's one record
  (``core.health_feed``), plus ids withdrawn because their card is in use the other way;
* ``agent`` — the supervisor: start/stop order and events (kubelet restarts, lost sockets,
  SIGHUP, SIGTERM) over the collaborators ``roles.node_agent`` builds: ``plugin_set``,
  ``board``, ``reload`` (what a new config changes), ``cdi``, ``exporter_slot``,
  ``inventory_publisher`` (the node inventory annotation), ``sharing_runtime`` (the sharing
  coordinator and the MPS daemon); ``retry`` is their one backoff rule;
* ``channels`` — client channels to re-created unix sockets (subchannels of their own, so a
  fresh channel dials the new socket instead of waiting out the old one's backoff);
* ``shares`` / ``coordinator`` / ``pod_view`` / ``reconcile`` / ``records`` / ``cluster`` —
  card-level sharing (``sharing.gpuShare``): the pure matching rules, the coordinator answering
  Allocate from the extender's decisions, its view of the node's pods (list + watch), the
  records kept true against PodResources, and its API / PodResources ports.

Annotations the node agent writes: ``kubegpu.io/gpu-inventory`` on its Node (every card's
UUID, index, model, memory, health), and on sharing pods ``kubegpu.io/gpu-allocated`` (which
container got which card and slot, when, and whether PodResources confirmed it) and, when
reconciliation had to repair something, ``kubegpu.io/gpu-drift`` (what and when). It also moves
a shared pod's ``kubegpu.io/gpu-allocation`` to the card the kubelet really gave it.
"""
