"""A throwaway redis-server on 127.0.0.1 for tests: no persistence, killed by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support import free_ports, wait_until


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin:/usr/sbin")
    if found is None:
        pytest.fail("redis-server is not installed: the limits integration tests need it "
                    "(Debian: apt-get install redis-server)", pytrace=False)
    return found


class RedisServer:
    """One redis-server process. `start` may be called again after `kill` (same port)."""

    def __init__(self, *extra: str, port: int | None = None, tls_port: int | None = None) -> None:
        self.port = port if port is not None else free_ports(1)[0]
        self.tls_port = tls_port
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="redis-test-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        args = [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", self._dir, "--enable-debug-command", "local", *self.extra]
        with Path(self._dir, "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(self.tls_port or self.port)
        return self

    def asleep(self) -> bool:
        """True while the server's main thread sleeps in `DEBUG SLEEP` (its kernel wait channel is the sleep,
        not its event loop's epoll_wait): a fact to wait on before testing a stalled server."""
        if self.proc is None:
            return False
        return Path(f"/proc/{self.proc.pid}/wchan").read_text() == "hrtimer_nanosleep"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.proc = None

    def _wait_ready(self, port: int) -> None:
        def accepting() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log = Path(self._dir, "redis.log").read_text(errors="replace")
                pytest.fail(f"redis-server exited with {self.proc.returncode}:\n{log}", pytrace=False)
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return True
            except OSError:
                return False

        try:
            wait_until(accepting, "redis-server accepting connections", timeout_s=10.0)
        except AssertionError:
            self.kill()
            pytest.fail("redis-server did not accept connections within 10 s", pytrace=False)
