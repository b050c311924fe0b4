"""Where computed labels go: an NFD feature file, the Node object, or stdout.

Each sink takes the *complete* desired label set and makes its destination match it, so a label
that stops being true disappears. The Node sink changes only labels :func:`owns_label` claims
(the fixed keys the catalogue can write, ours and GFD's); every other label on the Node, an
admin's ``kubegpu.io/device-plugin`` included, is never put into a patch, so labels set by
people or other controllers cannot be clobbered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Protocol

from kubegpu.atomic_file import write_atomically
from kubegpu.core.apiserver import ConflictError
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
        write_atomically(self.path, text, mode=0o644)  # nfd-worker may run as another user
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


class NodeLabelsApi(Protocol):
    """The Node's labels through the API server (the kube edge's
    :class:`~kubegpu.kube.node_labels.LightkubeNodeLabels`)."""

    def read_labels(self, node_name: str) -> tuple[dict[str, str], str | None]:
        """The Node's labels and the resourceVersion they were read at."""
        ...

    def patch_labels(
        self, node_name: str, patch: Mapping[str, str | None], resource_version: str | None
    ) -> None:
        """Merge ``patch`` into the labels (None removes a key) if the Node is still at
        ``resource_version``; raises :class:`~kubegpu.core.apiserver.ConflictError` when not."""
        ...


class NodeLabelSink:
    """Patches the Node's labels with a JSON merge patch.

    The patch carries the ``resourceVersion`` the diff was computed from, so a concurrent change
    to the Node makes the API server answer 409 and we recompute from the fresh object instead
    of removing or re-adding a label on stale information.
    """

    def __init__(self, api: NodeLabelsApi, node_name: str, *, max_attempts: int = 5) -> None:
        self.api = api
        self.node_name = node_name
        self.max_attempts = max_attempts

    def current(self) -> dict[str, str]:
        return self.api.read_labels(self.node_name)[0]

    def apply(self, labels: Mapping[str, str]) -> None:
        for attempt in range(1, self.max_attempts + 1):
            current, resource_version = self.api.read_labels(self.node_name)
            patch = node_label_patch(current, labels)
            if not patch:
                log.debug("node %s labels already current", self.node_name)
                return
            try:
                self.api.patch_labels(self.node_name, patch, resource_version)
            except ConflictError as conflict:
                if attempt < self.max_attempts:
                    log.info(
                        "node %s changed while labelling (attempt %d); retrying",
                        self.node_name,
                        attempt,
                    )
                    continue
                # Out of attempts: the API server's own answer (its status says why).
                raise (conflict.__cause__ or conflict) from None
            removed = sorted(k for k, v in patch.items() if v is None)
            log.info(
                "node %s: set %d labels, removed %s",
                self.node_name,
                len(patch) - len(removed),
                removed or "none",
            )
            return
