"""kubelet edge: device plugin and podresources gRPC APIs, registration and lifecycle."""
