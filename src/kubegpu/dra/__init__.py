"""kubegpu as a Dynamic Resource Allocation (``resource.k8s.io/v1``) driver: an edge of its own.

What lives here: which devices a node publishes in its ResourceSlice (pure), and what the
kubelet talks to (plugin-watcher registration, the ``v1.DRAPlugin``/``v1beta1.DRAPlugin`` gRPC
services, the prepared-claims checkpoint and the per-claim CDI specs). A claim's values are in
:mod:`kubegpu.core.dra`; the Kubernetes API sits behind the ports in
:mod:`kubegpu.core.dra_ports`, implemented with lightkube in :mod:`kubegpu.kube.resource_claims`
and :mod:`kubegpu.kube.resource_slices`. See ``docs/dra.md``.
"""
