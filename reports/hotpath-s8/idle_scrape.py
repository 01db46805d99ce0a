"""The service's fixed CPU cost with no traffic: `extproc serve` with one pool of ENDPOINTS endpoints (each a
tiny aiohttp server answering every path with the bench's JSON body, as the bench's direct-response backend
does), scraped every 100 ms (the default), its CPU read from /proc over SECONDS. Each TREE is a source tree run
with PYTHONPATH=TREE (same interpreter); trees alternate ROUNDS times.
usage: python idle_scrape.py SECONDS ROUNDS ENDPOINTS TREE [TREE...]"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from aiohttp import web

BODY = json.dumps({"id": "cmpl-bench", "object": "chat.completion", "model": "bench-model", "choices": [],
                   "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(tree: str, seconds: float, ports: list[int], hits: list[int]) -> tuple[float, float]:
    workdir = Path(tempfile.mkdtemp(prefix="idle-scrape-"))
    endpoints = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
    policy = workdir / "policy.yaml"
    policy.write_text(f"service: {{grpc_port: {free_port()}, admin_port: {free_port()}}}\n"
                      f"pools:\n  - {{name: bench, model: bench-model, endpoints: [{endpoints}]}}\n")
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.Popen([sys.executable, "-m", "extproc", "--log-level", "ERROR", "serve", "--config",
                             str(policy)], env=env, cwd=tree)
    try:
        await asyncio.sleep(5)  # started, first rounds done
        before, hits_before = cpu_s(proc.pid), hits[0]
        await asyncio.sleep(seconds)
        return (cpu_s(proc.pid) - before) / seconds * 1000, (hits[0] - hits_before) / seconds
    finally:
        proc.terminate()
        proc.wait()


async def main(seconds: float, rounds: int, count: int, trees: list[str]) -> None:
    hits = [0]

    async def answer(_: web.Request) -> web.Response:
        hits[0] += 1
        return web.Response(text=BODY, content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    ports = [free_port() for _ in range(count)]
    for port in ports:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    for round_ in range(rounds):
        for tree in trees:
            ms, rate = await measure(tree, seconds, ports, hits)
            print(f"round {round_ + 1} {tree}: {ms:.1f} ms CPU/s idle, {rate:.0f} scrapes/s "
                  f"(= {ms / 200 * 1000:.0f} us per request at 200 req/s)", flush=True)
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]))
