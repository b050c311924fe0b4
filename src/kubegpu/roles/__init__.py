"""Composition roots: one module per role of the ``kubegpu`` command, wiring its edges.

A role (node agent, extender, exporter, labeller) is the only place that knows which edges it
is made of: it opens the GPU backend (inventory edge), makes the Kubernetes clients (kube
edge), and hands them, as the small protocols each edge declares, to the edge that runs the
role. So the edges (kubelet, kube, inventory, exporter, labels, extender) import only the core
(core, sharing, placement), config, and themselves; the import-linter contracts in
``pyproject.toml`` keep it so. The click commands in :mod:`kubegpu.cli` parse options and call
these roots.
"""
