"""The `limits:` section as the loader reports it: Redis URLs and TLS files are checked at load, with file:line."""

from __future__ import annotations

import pytest

from extproc.config import ConfigError, parse_policy
from tests.certs import Certs, make_certs

POOLS = "pools:\n  - name: chat\n    model: m\n    endpoints: ['127.0.0.1:8001']\n"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_policy(POOLS + text, "p.yaml")
    return [str(p) for p in info.value.problems]


def test_a_unix_socket_url_is_refused_at_validation_not_at_start() -> None:
    [problem] = problems("limits:\n  store: redis\n  redis_url: unix:///var/run/redis.sock\n")
    assert problem.startswith("p.yaml:7:") and "Unix sockets are not supported" in problem


def test_tls_settings_load_and_reach_the_policy(certs: Certs) -> None:
    policy = parse_policy(POOLS + f"limits:\n  store: redis\n  redis_url: rediss://127.0.0.1:6380\n  redis_tls:\n"
                                  f"    ca_file: {certs.ca}\n    cert_file: {certs.client_cert}\n"
                                  f"    key_file: {certs.client_key}\n    server_name: redis.test\n")
    tls = policy.limits.redis_tls
    assert tls is not None and tls.ca_file == str(certs.ca) and tls.verify == "full"


@pytest.mark.parametrize(("tls", "line", "message"), [
    ("    ca_file: /nonexistent/ca.pem\n", 9, "/nonexistent/ca.pem: No such file or directory"),
    ("    ca_file: {client_cert}\n    cert_file: /tmp\n", 10, "/tmp: Is a directory"),
    ("    ca_file: ca.pem\n", 9, "must be an absolute path"),
    ("    cert_file: {client_cert}\n    key_file: {rogue_key}\n", 8, "not a valid PEM certificate / key pair"),
    ("    verify: no\n", 9, "'full' or 'ca'"),
    ("    certfile: /x\n", 9, "Extra inputs are not permitted"),
])
def test_bad_tls_settings_name_the_file_and_line(certs: Certs, tls: str, line: int, message: str) -> None:
    tls = tls.format(client_cert=certs.client_cert, rogue_key=certs.rogue_client_key)
    found = problems(f"limits:\n  store: redis\n  redis_url: rediss://127.0.0.1\n  redis_tls:\n{tls}")
    assert any(p.startswith(f"p.yaml:{line}:") and message in p for p in found), found


def test_tls_settings_need_a_rediss_url(certs: Certs) -> None:
    [problem] = problems(f"limits:\n  redis_url: redis://127.0.0.1\n  redis_tls: {{ca_file: {certs.ca}}}\n")
    assert problem.startswith("p.yaml:5:") and "needs a rediss:// redis_url" in problem
