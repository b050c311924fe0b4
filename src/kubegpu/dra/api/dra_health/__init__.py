"""DRA resource health API (proto package ``v1alpha1``, ``k8s.io/kubelet/pkg/apis/dra-health``)."""
