"""Kubelet plugin registration API (proto package ``pluginregistration``)."""
