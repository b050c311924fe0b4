"""kubegpu as a Dynamic Resource Allocation (``resource.k8s.io/v1``) driver.

What lives here: the pure parts (which devices a node publishes in its ResourceSlice, what a
prepared claim is) and the node edge that the kubelet talks to (plugin-watcher registration,
the ``v1.DRAPlugin``/``v1beta1.DRAPlugin`` gRPC services, the prepared-claims checkpoint and the
per-claim CDI specs). The Kubernetes API sits behind the small ports in :mod:`kubegpu.dra.ports`;
the lightkube implementations are :mod:`kubegpu.kube.resource_claims` and
:mod:`kubegpu.kube.resource_slices`. See ``docs/dra.md``.
"""
