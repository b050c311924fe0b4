"""``kubegpu demo``: the whole system on a laptop (fake API server, fake-GPU nodes with real
node agents and kubelet emulators, the real extender, a scheduler stand-in)."""
