"""Tests of the generated kubelet wire API modules."""
