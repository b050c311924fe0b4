"""Generated gRPC modules for the kubelet's wire APIs (quarantined: no ruff, no mypy).

``deviceplugin.v1beta1``: device plugin API (services ``v1beta1.Registration``,
``v1beta1.DevicePlugin``). ``podresources.v1``: PodResources API (``v1.PodResourcesLister``).
The ``.proto`` sources sit next to the generated modules; regenerate with
``python -m kubegpu.kubelet.protogen``. Wire types stay at the edge: convert to our own frozen
dataclasses before handing values to the rest of kubegpu.
"""
