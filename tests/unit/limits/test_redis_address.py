"""Redis URLs and TLS settings: parsed and checked before anything connects (certificates made by openssl)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from extproc.limits.redis_address import Address, RedisTls, parse_url
from tests.certs import Certs, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_urls() -> None:
    parsed = parse_url("rediss://u%40x:p%3Aw@example:7000/3")
    assert (parsed.tls, parsed.host, parsed.port, parsed.username, parsed.password, parsed.db) == (
        True, "example", 7000, "u@x", "p:w", 3)
    assert parse_url("redis://h") == parse_url("redis://h:6379/0")


@pytest.mark.parametrize(("url", "message"), [
    ("unix:///var/run/redis.sock", "Unix sockets are not supported"),
    ("http://h", "must start with redis:// or rediss://"),
    ("redis://h/zero", "database in a Redis URL must be a number"),
    ("redis://h:port", "port in a Redis URL"),
    ("redis://h:70000", "port in a Redis URL"),
])
def test_urls_we_cannot_use_are_named(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_url(url)


def test_tls_settings_build_the_context(certs: Certs) -> None:
    tls = RedisTls(ca_file=str(certs.ca), cert_file=str(certs.client_cert), key_file=str(certs.client_key),
                   server_name="redis.test")
    address = Address.from_url("rediss://127.0.0.1:6380", tls)
    assert isinstance(address.tls, ssl.SSLContext) and address.tls.check_hostname
    assert address.tls.verify_mode == ssl.CERT_REQUIRED and address.tls_server_name == "redis.test"
    chain_only = Address.from_url("rediss://127.0.0.1", RedisTls(ca_file=str(certs.ca), verify="ca"))
    assert chain_only.tls is not None and not chain_only.tls.check_hostname
    assert chain_only.tls.verify_mode == ssl.CERT_REQUIRED and chain_only.tls_server_name == "127.0.0.1"
    assert Address.from_url("redis://127.0.0.1").tls_server_name is None
    with pytest.raises(ValueError, match="need a rediss:// URL"):
        Address.from_url("redis://127.0.0.1", tls)


@pytest.mark.parametrize(("settings", "message"), [
    ({"ca_file": "ca.pem"}, "must be an absolute path"),
    ({"ca_file": "/nonexistent/ca.pem"}, "/nonexistent/ca.pem: No such file or directory"),
    ({"key_file": "{dir}"}, "{dir}: Is a directory"),  # not a readable file
    ({"ca_file": "{garbage}"}, "not a valid PEM"),
    ({"cert_file": "{client_cert}"}, "cert_file {client_cert}: "),  # its key is elsewhere
    ({"cert_file": "{client_cert}", "key_file": "{rogue_key}"}, "not a valid PEM certificate / key pair"),
    ({"key_file": "{client_key}"}, "key_file needs cert_file"),
    ({"verify": "none"}, "Input should be 'full' or 'ca'"),
])
def test_bad_tls_settings_are_refused_with_the_file(certs: Certs, tmp_path: Path, settings: dict[str, str],
                                                    message: str) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    names = {"dir": str(tmp_path), "garbage": str(garbage), "client_cert": str(certs.client_cert),
             "client_key": str(certs.client_key), "rogue_key": str(certs.rogue_client_key)}
    with pytest.raises(ValidationError, match=message.format(**names)):
        RedisTls(**{key: value.format(**names) for key, value in settings.items()})
