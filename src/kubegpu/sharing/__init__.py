"""GPU sharing's pure rules: resource names and units, pod requests, the allocation protocol
(:mod:`~kubegpu.sharing.claim` owns it: a pod's claim, its transitions, the annotations'
codecs) and card-level accounting. No I/O; the Kubernetes edge (:mod:`kubegpu.kube`), the
extender, the node agent and ``inspect`` call these (docs/allocation-protocol.md)."""
