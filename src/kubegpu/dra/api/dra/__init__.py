"""DRA kubelet plugin API (proto packages ``k8s.io.kubelet.pkg.apis.dra.v1`` and ``.v1beta1``)."""
