"""Device plugin API (proto package ``v1beta1``)."""
