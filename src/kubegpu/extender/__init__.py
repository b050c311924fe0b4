"""The kube-scheduler extender: HTTP verbs over the placement engine with a cluster-wide,
card-level view built from list + watch (see docs/sharing.md)."""
