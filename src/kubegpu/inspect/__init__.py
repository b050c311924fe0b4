"""``kubegpu inspect`` / ``kubectl gpu inspect``: the cluster's GPUs per node and card.

Layers, inward to outward:

* :mod:`~kubegpu.inspect.usage` — the exporter's ``/metrics`` text as per-card and per-pod
  used memory (pure parsing).
* :mod:`~kubegpu.inspect.model` — Nodes' and Pods' JSON (+ optional usage) to one frozen
  :class:`~kubegpu.inspect.model.InspectReport`: cards, pods on them, totals, pending pods and
  drift warnings. Pure; the annotation protocol and pod arithmetic come from
  :mod:`kubegpu.sharing`, never re-parsed here.
* :mod:`~kubegpu.inspect.mig` — a node's cards in MIG mode (``kubegpu.io/mig-devices``) with
  their MIG devices and the pods holding them, added to its view by the model.
* :mod:`~kubegpu.inspect.render` — the report as a table (:mod:`~kubegpu.inspect.table`, MIG
  devices by :mod:`~kubegpu.inspect.mig_render`) or as JSON that ``schema.json`` (shipped
  beside it) describes.
* :mod:`~kubegpu.kube.cluster_reader` and :mod:`~kubegpu.inspect.exporters` — the edges: lightkube
  list + watch with kubectl's kubeconfig resolution, and bounded concurrent ``/metrics`` fetches.
* :mod:`~kubegpu.inspect.command` — the click command, also installed as ``kubectl-gpu``.
"""
