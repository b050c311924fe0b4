"""GPU inventory and health: the only edge that talks to NVML (or its fake stand-in)."""
