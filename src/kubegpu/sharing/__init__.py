"""GPU sharing's pure rules: resource names and units, pod requests, the annotation protocol
and card-level accounting. No I/O; the Kubernetes edge (:mod:`kubegpu.kube`) and the extender
(:mod:`kubegpu.extender`) call these."""
