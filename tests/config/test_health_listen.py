"""``flags.healthListen``: the node agent's probe address, checked when the config loads."""

from __future__ import annotations

import pytest

from kubegpu.config.load import ConfigError, load_config
from kubegpu.config.model import parse_listen_address


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.0.0.0:9401", ("0.0.0.0", 9401)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9401", ("::1", 9401)),
        (":9401", ("0.0.0.0", 9401)),
        ("localhost:65535", ("localhost", 65535)),
    ],
    ids=["any-ipv4", "free-port", "ipv6", "no-host", "highest-port"],
)
def test_a_listen_address_parses_to_host_and_port(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(value) == expected


@pytest.mark.parametrize("value", ["9401", "host:", "host:http", "host:65536", "host:-1"])
def test_a_malformed_listen_address_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=f"expected HOST:PORT .*got {value!r}"):
        parse_listen_address(value)


def test_health_endpoints_are_off_by_default() -> None:
    assert load_config(None).flags.health_listen == ""


def test_a_bad_address_in_the_config_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"flags.healthListen": "9401"})
    assert err.value.field == "flags.healthListen"
    assert "expected HOST:PORT" in str(err.value)
