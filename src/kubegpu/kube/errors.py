"""The kube edge's error for a kubeconfig that cannot be used, in a module of its own.

It imports nothing, so the command line can catch it around every subcommand without
loading lightkube and its HTTP stack for ``kubegpu --help`` or the roles that never talk to the
API server.
"""

from __future__ import annotations


class KubeconfigError(ValueError):
    """There is no usable kubeconfig; the message names the file (and the file it names that
    is missing or unusable) or says where it looked."""
