"""Tests of the kubelet stand-ins shipped in kubegpu.testing."""
