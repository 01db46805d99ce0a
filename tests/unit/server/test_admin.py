"""Who may use the protected admin endpoints without a token (a loopback peer naming a loopback host)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from extproc.server.admin import _loopback


class Transport:
    """A connection from `peer` (a non-loopback peer cannot connect to a 127.0.0.1 server here)."""

    def __init__(self, peer: str) -> None:
        self.peer = peer

    def get_extra_info(self, name: str, default: object = None) -> object:
        return (self.peer, 1234) if name == "peername" else default


def request(peer: str, host: str) -> web.Request:
    return make_mocked_request("GET", "/debug/pools", headers={"Host": host},
                               transport=Transport(peer))  # type: ignore[arg-type]


def test_loopback_means_a_loopback_peer_and_host() -> None:
    assert _loopback(request("127.0.0.1", "127.0.0.1:9003"))
    assert _loopback(request("::1", "[::1]:9003"))
    assert _loopback(request("127.0.0.1", "localhost"))
    assert not _loopback(request("10.1.2.3", "127.0.0.1:9003"))  # another pod through the Service
    assert not _loopback(request("127.0.0.1", "evil.example:9003"))  # DNS rebinding
