"""kubegpu: GPUs as a first-class, shareable, observable resource in Kubernetes."""

__version__ = "0.1.0"
