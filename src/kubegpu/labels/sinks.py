"""Where computed labels go: an NFD feature file, the Node object, or stdout.

Each sink takes the *complete* desired label set and makes its destination match it, so a label
that stops being true disappears. The Node sink changes only labels :func:`owns_label` claims
(the fixed keys the catalogue can write, ours and GFD's); every other label on the Node, an
admin's ``kubegpu.io/device-plugin`` included, is never put into a patch, so labels set by
people or other controllers cannot be clobbered.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from kubegpu.labels.catalogue import owns_label

log = logging.getLogger(__name__)

DEFAULT_NFD_FEATURE_FILE = Path("/etc/kubernetes/node-feature-discovery/features.d/kubegpu")


class LabelSink(Protocol):
    def apply(self, labels: Mapping[str, str]) -> None:
        """Make the destination hold exactly ``labels`` among the labels we own, writing
        nothing when it already does."""
        ...

    def current(self) -> Mapping[str, str] | None:
        """What the destination holds now (``None``: it cannot be read back)."""
        ...


class NfdFeatureFileSink:
    """Writes ``key=value`` lines for NFD's ``local`` source. The whole file is ours, so
    rewriting it removes stale labels. Written atomically (temp file in the same directory,
    then rename) so nfd-worker never reads half a file, and only when its content changes."""

    def __init__(self, path: Path = DEFAULT_NFD_FEATURE_FILE) -> None:
        self.path = path

    def current(self) -> dict[str, str] | None:
        try:
            return parse_feature_file(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None

    def apply(self, labels: Mapping[str, str]) -> None:
        text = "".join(f"{key}={value}\n" for key, value in sorted(labels.items()))
        try:
            unchanged = self.path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            unchanged = False
        if unchanged:
            log.debug("%s already current", self.path)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)  # nfd-worker may run as another user
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        log.debug("wrote %d labels to %s", len(labels), self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def parse_feature_file(text: str) -> dict[str, str]:
    """Read back a feature file (NFD's format: ``key=value`` per line, ``#`` comments)."""
    labels: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        labels[key] = value
    return labels


class StdoutSink:
    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def current(self) -> None:
        return None

    def apply(self, labels: Mapping[str, str]) -> None:
        for key, value in sorted(labels.items()):
            self.stream.write(f"{key}={value}\n")
        self.stream.flush()


def node_label_patch(
    current: Mapping[str, str],
    desired: Mapping[str, str],
    owns: Callable[[str], bool] = owns_label,
) -> dict[str, str | None]:
    """The ``metadata.labels`` part of a JSON merge patch taking ``current`` to ``desired``
    for the keys we own: changed or new keys with their value, owned keys no longer desired
    with ``None`` (``null`` removes a key in a merge patch). Empty when nothing changes."""
    foreign = sorted(key for key in desired if not owns(key))
    if foreign:
        raise ValueError(f"refusing to write labels this labeller does not own: {foreign}")
    patch: dict[str, str | None] = {
        key: value for key, value in desired.items() if current.get(key) != value
    }
    for key in current:
        if owns(key) and key not in desired:
            patch[key] = None
    return dict(sorted(patch.items()))


class NodeLabelSink:
    """Patches the Node's labels through lightkube with a JSON merge patch.

    The patch carries the ``resourceVersion`` the diff was computed from, so a concurrent change
    to the Node makes the API server answer 409 and we recompute from the fresh object instead
    of removing or re-adding a label on stale information.
    """

    def __init__(self, client: Any, node_name: str, *, max_attempts: int = 5) -> None:
        # ``client`` is a ``lightkube.Client``; typed loosely so this module imports lightkube
        # only when used.
        self.client = client
        self.node_name = node_name
        self.max_attempts = max_attempts

    def current(self) -> dict[str, str]:
        from lightkube.resources.core_v1 import Node

        metadata = self.client.get(Node, name=self.node_name).metadata
        return dict((metadata.labels if metadata else None) or {})

    def apply(self, labels: Mapping[str, str]) -> None:
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        for attempt in range(1, self.max_attempts + 1):
            node = self.client.get(Node, name=self.node_name)
            metadata = node.metadata
            current = dict((metadata.labels if metadata else None) or {})
            patch = node_label_patch(current, labels)
            if not patch:
                log.debug("node %s labels already current", self.node_name)
                return
            body = {
                "metadata": {
                    "labels": patch,
                    "resourceVersion": metadata.resourceVersion if metadata else None,
                }
            }
            try:
                self.client.patch(Node, self.node_name, body, patch_type=PatchType.MERGE)
            except ApiError as exc:
                if exc.status.code == 409 and attempt < self.max_attempts:
                    log.info(
                        "node %s changed while labelling (attempt %d); retrying",
                        self.node_name,
                        attempt,
                    )
                    continue
                raise
            removed = sorted(k for k, v in patch.items() if v is None)
            log.info(
                "node %s: set %d labels, removed %s",
                self.node_name,
                len(patch) - len(removed),
                removed or "none",
            )
            return
