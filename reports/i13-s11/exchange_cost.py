"""What one replica's in-flight exchange (`extproc.server.fleet.FleetSync.sync_once`) costs: CPU of this process per
exchange and redis-server CPU per exchange, with 3 replicas' fields in the hash and 4 endpoints with requests in
flight (the overload benchmark's fleet). Run (it starts its own redis-server on a free port):

  flock /work/wt/bench.lock .venv/bin/python reports/i13-s11/exchange_cost.py [ROUNDS]

Per second of exchanges at interval I ms a replica spends (CPU per exchange) x 1000 / I; the redis-server
(redis CPU per exchange) x replicas x 1000 / I.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

from extproc.endpoints import EndpointRegistry
from extproc.limits.resp import Address, RespClient
from extproc.server.fleet import FleetSync

ADDRESSES = [f"10.0.0.{i}:8000" for i in range(4)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def redis_cpu(client: RespClient) -> float:
    info = (await client.call("INFO", "cpu")).decode()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])


async def main(rounds: int) -> None:
    port = free_port()
    server = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        url = f"redis://127.0.0.1:{port}/0"
        syncs = []
        for name in ("a", "b", "c"):
            registry = EndpointRegistry()
            registry.adopt([("chat", ADDRESSES)])
            for i, endpoint in enumerate(registry.endpoints()):
                endpoint.in_flight = 10 + i
            client = RespClient(Address.from_url(url), timeout_s=1.0, scripts=FleetSync.SCRIPTS)
            syncs.append(FleetSync(client, registry, 0.02, stale_after_s=1.0, replica_id=name))
        probe = RespClient(Address.from_url(url), timeout_s=1.0)
        for sync in syncs:
            await sync.sync_once()
        before_redis = await redis_cpu(probe)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            await syncs[0].sync_once()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        spent = await redis_cpu(probe) - before_redis
        print(f"{rounds} exchanges of one replica (3 in the hash, 4 endpoints): this process {cpu / rounds * 1e6:.0f} "
              f"us CPU each ({wall / rounds * 1e6:.0f} us wall, round trip included); redis-server "
              f"{spent / rounds * 1e6:.0f} us CPU each (INFO cpu, includes the probe's 2 calls)")
        for interval_ms in (20, 10, 5):
            print(f"  at {interval_ms} ms: {cpu / rounds * 1000 / interval_ms * 100:.1f}% of a core per replica, "
                  f"redis {spent / rounds * 3 * 1000 / interval_ms * 100:.1f}% of a core for 3 replicas")
        for sync in syncs:
            await sync.stop()
        await probe.close()
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))
