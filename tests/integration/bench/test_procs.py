"""Readiness probes of the bench's process group against real ports (a local server, a closed port)."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from extproc.bench.procs import ChildExited, ProcessGroup, wait_http_ok, wait_port

from .conftest import Server

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_wait_port(server: Server, tmp_path: Path) -> None:
    await wait_port("127.0.0.1", server.port, 1.0)
    await wait_http_ok(f"http://127.0.0.1:{server.port}/json", 1.0)
    with pytest.raises(TimeoutError):
        await wait_http_ok(f"http://127.0.0.1:{server.port}/status/503", 0.2)
    async with ProcessGroup(tmp_path) as group:
        doomed = await group.start("doomed", [sys.executable, "-c", "raise SystemExit(4)"])
        with pytest.raises(ChildExited, match="exited with 4"):
            await wait_port("127.0.0.1", _closed_port(), 5.0, child=doomed)


async def test_wait_port_times_out_on_closed_port() -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await wait_port("127.0.0.1", _closed_port(), 0.2)
    assert time.monotonic() - start < 2.0  # the 0.2 s bound is the behaviour: it gives up, it does not hang
