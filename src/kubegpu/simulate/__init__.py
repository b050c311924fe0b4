"""Trace replay (`kubegpu simulate`): the FGD paper's method over the placement engine."""
