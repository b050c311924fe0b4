"""The extender's settings are a model of the one config system (:mod:`kubegpu.config.extender`).

What remains here are the body-size defaults the verbs' server reads (extender/server.py, which
another branch owns, imports them from this path).
"""

from kubegpu.config.extender import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_INFLIGHT_BODY_BYTES

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_INFLIGHT_BODY_BYTES"]
