"""Generated gRPC modules for the kubelet's DRA wire APIs (quarantined: no ruff, no mypy).

``pluginregistration.v1``: the plugin watcher's ``pluginregistration.Registration``.
``dra.v1`` / ``dra.v1beta1``: the DRA kubelet plugin service (``v1.DRAPlugin``,
``v1beta1.DRAPlugin``). The ``.proto`` sources are byte-identical copies of the pinned
``k8s.io/kubelet`` module's; regenerate with ``python -m kubegpu.kubelet.protogen``.
"""
