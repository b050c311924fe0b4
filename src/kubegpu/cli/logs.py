"""Logging setup shared by every role: plain text for people, JSON lines for log pipelines."""

from __future__ import annotations

import json
import logging
import sys

# The HTTP clients under the Kubernetes client log every request at INFO: one line every 10 s
# per role and node (the exporter's pod listing), which buried the lines that name a node,
# device or pod in the installed node agent's log. Their warnings still show; --log-level
# debug shows their requests too.
_CHATTY_AT_INFO = ("httpx", "httpx2", "httpcore", "httpcore2")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: int, *, json_format: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in _CHATTY_AT_INFO:
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else logging.WARNING)
