"""How a GPU share is enforced on the node: ``none`` (trust: the container is told its share
in the environment and nothing holds it to it) or ``mps`` (the CUDA MPS control daemon,
supervised by :mod:`kubegpu.enforcement.mps`, enforces per-client memory and thread limits)."""
