"""Stand-ins shipped in the package for what cannot run here (kubelet, API server).

Each speaks the real wire protocol and enforces the real semantics.
"""
