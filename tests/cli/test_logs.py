"""The roles' logging: the HTTP clients' per-request lines stay out of INFO logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from kubegpu.cli.logs import configure_logging


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    levels = {n: logging.getLogger(n).level for n in ("httpx", "httpx2")}
    yield
    root.handlers[:], level = saved
    root.setLevel(level)
    for name, old in levels.items():
        logging.getLogger(name).setLevel(old)


def test_http_client_requests_are_not_logged_at_info(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(logging.INFO)
    logging.getLogger("httpx2").info('HTTP Request: GET https://10.96.0.1/api/v1/pods "200 OK"')
    logging.getLogger("httpx2").warning("retrying after a reset connection")
    logging.getLogger("kubegpu.labels").info("node n1: set 30 labels")
    err = capsys.readouterr().err
    assert "HTTP Request" not in err
    assert "retrying after a reset connection" in err
    assert "node n1: set 30 labels" in err


def test_debug_shows_the_http_client_requests(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(logging.DEBUG)
    logging.getLogger("httpx2").info("HTTP Request: GET https://10.96.0.1/api/v1/pods")
    assert "HTTP Request" in capsys.readouterr().err
