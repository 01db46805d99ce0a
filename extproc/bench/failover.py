"""`extproc bench failover`: kill 1 of N replicas under steady load, measure what clients and the router see.

A replica "dies" (the simulator closes its port and resets every open connection, like a crashed
process) while non-streaming load runs; later it comes back. The report gives client errors, how long
after the kill our router stopped picking the dead replica, and how long after its return it was
picked again (from the service's /debug/pools, polled every 50 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from extproc.bench.httpclient import HttpClient
from extproc.bench.loadgen import RequestSpec, run_open_loop
from extproc.bench.procs import ProcessGroup
from extproc.bench.report import format_table, write_json
from extproc.bench.stack import SimPool, Stack, launch
from extproc.bench.stats import summarize

_POLL_S = 0.05


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=4, help="simulated replicas in the pool (default 4)")
    parser.add_argument("--rate", type=float, default=40.0, help="non-streaming req/s (default 40)")
    parser.add_argument("--kill-at", type=float, default=3.0, help="seconds into the load to kill one replica")
    parser.add_argument("--down-for", type=float, default=5.0, help="seconds the replica stays dead")
    parser.add_argument("--tail", type=float, default=4.0, help="seconds of load after it comes back")
    parser.add_argument("--json", metavar="FILE", default="reports/failover.json", help="report path")
    parser.add_argument("--workdir", metavar="DIR", help="where config and logs go (default: temp)")


def _spec(index: int) -> RequestSpec:
    body = {"model": "chat", "messages": [{"role": "user", "content": f"question {index}"}], "max_tokens": 16}
    return RequestSpec("POST", "/v1/chat/completions", (("content-type", "application/json"),),
                       json.dumps(body).encode())


async def _picked(client: HttpClient, stack: Stack, address: str) -> int:
    port = stack.policy.service.admin_port
    response = await client.request("GET", "127.0.0.1", port, "/debug/pools", timeout_s=2)
    pool = json.loads(response.body)["pools"]["chat"]
    return int(next(e["picked_total"] for e in pool if e["address"] == address))


async def _fault(client: HttpClient, stack: Stack, victim: int, refuse: bool) -> None:
    sibling = next(p for p in stack.sim_ports["chat"] if p != victim)
    body = json.dumps({"refuse": refuse}).encode()
    await client.request("POST", "127.0.0.1", sibling, f"/sim/faults?port={victim}",
                         (("content-type", "application/json"),), body, timeout_s=5)


async def _watch(client: HttpClient, stack: Stack, address: str, start: float, until: float,
                 changes: list[tuple[float, int]]) -> None:
    """Record (time since start, picked_total) whenever the dead replica's pick count changes."""
    last = -1
    while time.monotonic() < until:
        count = await _picked(client, stack, address)
        if count != last:
            changes.append((time.monotonic() - start, count))
            last = count
        await asyncio.sleep(_POLL_S)


async def run_failover(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="extproc-failover-"))
    duration = args.kill_at + args.down_for + args.tail
    report: dict[str, Any] = {"replicas": args.replicas, "rate": args.rate, "kill_at_s": args.kill_at,
                              "down_for_s": args.down_for, "workdir": str(workdir)}
    async with ProcessGroup(workdir / "logs") as group:
        stack = await launch(group, workdir, [SimPool("chat", "org/chat", args.replicas, aliases=("chat",))],
                             sim_args=["--profile", "fast"])
        victim = stack.sim_ports["chat"][0]
        address = f"127.0.0.1:{victim}"
        changes: list[tuple[float, int]] = []
        async with HttpClient() as client:
            start = time.monotonic()
            load = asyncio.create_task(run_open_loop("127.0.0.1", stack.envoy_port, _spec, rate=args.rate,
                                                     duration_s=duration, arrival="fixed", timeout_s=10))
            watch = asyncio.create_task(_watch(client, stack, address, start, start + duration, changes))
            await asyncio.sleep(args.kill_at)
            await _fault(client, stack, victim, refuse=True)
            killed = time.monotonic() - start
            print(f"killed {address} at {killed:.2f} s", file=sys.stderr)
            await asyncio.sleep(args.down_for)
            await _fault(client, stack, victim, refuse=False)
            revived = time.monotonic() - start
            print(f"revived {address} at {revived:.2f} s", file=sys.stderr)
            samples = await load
            await watch
    last_pick_while_dead = max((t for t, _ in changes if killed <= t < revived), default=killed)
    first_pick_after = min((t for t, _ in changes if t >= revived), default=None)
    summary = summarize(samples)
    report.update(
        killed_at_s=round(killed, 3), revived_at_s=round(revived, 3),
        stopped_picking_after_kill_s=round(last_pick_while_dead - killed, 3),
        picked_again_after_revival_s=None if first_pick_after is None else round(first_pick_after - revived, 3),
        requests=summary["total"], errors=summary["errors"], status=summary["status"], e2e_ms=summary["e2e_ms"],
        pick_timeline=[[round(t, 3), c] for t, c in changes],
    )
    rows = [{"metric": "requests", "value": report["requests"]},
            {"metric": "client errors", "value": sum(report["errors"].values())},
            {"metric": "last pick of the dead replica after the kill (s)",
             "value": report["stopped_picking_after_kill_s"]},
            {"metric": "first pick after it came back (s)", "value": report["picked_again_after_revival_s"]},
            {"metric": "e2e p50 / p99 (ms)", "value": f"{summary['e2e_ms']['p50']} / {summary['e2e_ms']['p99']}"}]
    print(format_table(rows, ["metric", "value"]))
    print(f"report written to {write_json(args.json, report)}")
    back = report["picked_again_after_revival_s"]
    ok = not report["errors"] and report["stopped_picking_after_kill_s"] < 1.0 and back is not None and back < 1.0
    return 0 if ok else 1
