"""A throwaway Redis Cluster on 127.0.0.1 for tests: 3 primaries + 3 replicas (redis-server and
`redis-cli --cluster create`), fast failover (cluster-node-timeout 1 s); every process killed by PID."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess

import pytest
from redis import Redis
from redis.cluster import RedisCluster as RedisClusterClient
from redis.exceptions import RedisError

from tests.integration.limits.redis_server import RedisServer, redis_server_binary
from tests.support import wait_until

_NODE_TIMEOUT_MS = 1000


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_ports(count: int) -> list[int]:
    """Ports whose cluster bus port (+10000) is free too."""
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(20_000, 30_000)
        if port not in ports and _free(port) and _free(port + 10_000):
            ports.append(port)
    return ports


class RedisCluster:
    def __init__(self, nodes: int = 6) -> None:
        self.servers = [RedisServer("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                                    "--cluster-node-timeout", str(_NODE_TIMEOUT_MS), port=port)
                        for port in _cluster_ports(nodes)]

    def start(self) -> RedisCluster:
        redis_server_binary()
        cli = shutil.which("redis-cli") or pytest.fail("redis-cli is not installed (Debian: redis-tools)")
        for server in self.servers:
            server.start()
        subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in self.servers),
                        "--cluster-replicas", "1", "--cluster-yes"], check=True, capture_output=True, timeout=30)
        self.wait(lambda: all(self.healthy(s.port) for s in self.servers), "cluster_state:ok on every node")
        self.wait(self.replicated, "every primary's replica attached and in sync")
        return self

    def replicated(self) -> bool:
        primaries = self.primaries()
        for server in self.servers:
            with self.node(server.port) as node:
                info = node.info("replication")
            if info.get("connected_slaves" if server.port in primaries else "master_link_status") not in (1, "up"):
                return False
        return True

    def stop(self) -> None:
        for server in self.servers:
            server.kill()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.servers[0].port}"

    def node(self, port: int) -> Redis:
        return Redis(host="127.0.0.1", port=port, socket_timeout=2)

    def reader(self) -> RedisClusterClient:
        """redis-py's own cluster client (it follows redirections), to look at what the store wrote."""
        live = next(s for s in self.servers if s.proc is not None)
        return RedisClusterClient(host="127.0.0.1", port=live.port, socket_timeout=2)

    def healthy(self, port: int) -> bool:
        try:
            with self.node(port) as node:
                return b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
        except (OSError, RedisError):  # redis-py raises its own ConnectionError on a dead node
            return False

    def owner(self, slot: int, ask: int | None = None) -> int:
        """The port of the primary serving `slot` (as node `ask` sees it, by default any live node)."""
        ports = [ask] if ask is not None else [s.port for s in self.servers if s.proc is not None]
        for port in ports:
            with self.node(port) as node:
                for start, end, primary, *_ in node.execute_command("CLUSTER", "SLOTS"):  # type: ignore[no-untyped-call]
                    if start <= slot <= end:
                        return int(primary[1])
        raise AssertionError(f"slot {slot} is not served")

    def node_id(self, port: int) -> str:
        with self.node(port) as node:
            return str(node.execute_command("CLUSTER", "MYID").decode())  # type: ignore[no-untyped-call]

    def primaries(self) -> list[int]:
        with self.node(self.servers[0].port) as node:
            return sorted({int(primary[1]) for _, _, primary, *_ in
                           node.execute_command("CLUSTER", "SLOTS")})  # type: ignore[no-untyped-call]

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    @staticmethod
    def wait(condition: object, what: str, timeout_s: float = 20.0) -> None:
        assert callable(condition)
        wait_until(condition, f"redis cluster {what}", timeout_s=timeout_s, interval_s=0.05)
