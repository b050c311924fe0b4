"""PodResources API (proto package ``v1``)."""
