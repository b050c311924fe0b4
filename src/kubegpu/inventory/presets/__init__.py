"""Fake GPU node specs shipped with the package (see :mod:`kubegpu.inventory.spec`)."""
