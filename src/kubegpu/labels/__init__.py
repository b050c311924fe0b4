"""Node feature labels: what a node's GPUs are, as labels a node selector can match.

:mod:`~kubegpu.labels.catalogue` computes the labels (pure), :mod:`~kubegpu.labels.sinks`
writes them to an NFD feature file, the Node object or stdout, and
:mod:`~kubegpu.labels.labeller` keeps them current.
"""
