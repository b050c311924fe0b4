"""The openb replay on the real control plane: KWOK nodes made from a trace's node list, with the
GPU inventory and device counts kubegpu's own node-agent code computes for them, pods created in
the order `kubegpu simulate` reads, the real kube-scheduler with the kubegpu extender, and the
allocation ratio read back from the API server beside the simulator's for the same pods.

``trace`` turns a trace (openb, or the small cluster the CI test generates) into nodes, pods and
the simulator's expectation; ``fleet`` makes the KWOK nodes; ``replay`` creates the pods and
reads the outcome; ``bench`` is the 1,213-node benchmark (``e2e/run --bench-scale``).
"""
