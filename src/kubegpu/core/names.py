"""Spellings shared by every role: label-safe values, and the one form GPU model names compare in.

The inventory carries NVML's product name (``Tesla T4``), the feature labels carry it made
label-safe as gpu-feature-discovery does (``Tesla-T4``), and users copy either into a pod's
``kubegpu.io/gpu-models``. :func:`model_key` is the single spelling under which the extender's
accounting, the pod's request and the target workload compare models, so both are accepted.
"""

from __future__ import annotations

import re
from functools import lru_cache

LABEL_VALUE_MAX = 63  # a label value, and the name part of a label key

# Names as kube-apiserver validates them: an object's name is a DNS-1123 subdomain, a
# namespace's a DNS-1123 label. Checked before a name from a request goes into a URL.
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
_DNS_LABEL_PART = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_DNS_LABEL_PART)
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL_PART}(?:\.{_DNS_LABEL_PART})*")


def is_dns_label(name: str) -> bool:
    """Whether ``name`` is a DNS-1123 label (a namespace's name)."""
    return len(name) <= DNS_LABEL_MAX and _DNS_LABEL.fullmatch(name) is not None


def is_dns_subdomain(name: str) -> bool:
    """Whether ``name`` is a DNS-1123 subdomain (most objects' names, a node's)."""
    return len(name) <= DNS_SUBDOMAIN_MAX and _DNS_SUBDOMAIN.fullmatch(name) is not None


_INVALID = re.compile(r"[^A-Za-z0-9._-]+")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


def sanitise_label_value(raw: str) -> str:
    """Make ``raw`` a valid label value: runs of other characters become ``-`` (as GFD does
    with spaces), it is cut to 63 characters and trimmed to start and end alphanumeric.
    May return ``""``, which Kubernetes accepts as a value."""
    value = _INVALID.sub("-", raw.strip())
    value = _EDGE.sub("", value)[:LABEL_VALUE_MAX]
    return _EDGE.sub("", value)


@lru_cache(maxsize=4096)
def model_key(name: str) -> str:
    """How a GPU model name compares: its feature-label spelling (``Tesla T4`` and
    ``Tesla-T4`` are one model). ``""`` for a name with no letter or digit."""
    return sanitise_label_value(name)
