"""Reproduce issue 14 item 4's flake under CPU contention, instrumented.

The stack of tests/integration/security/test_attacks.py (real Envoy + service + simulator, the same tenants and
policy); then ROUNDS rounds of the test's attack: 8 closed-loop attackers posting 3.5 MB bodies for a model their
tenant may not use, for 3 s, while a victim tenant sends 20 req/s (fixed arrivals). With BUSY busy-loop processes
(`python -c 'while True: pass'`, normal priority, each in its own session, started here and killed by PID)
competing for the 2 cores.

Per round: victim statuses and latency, attacker statuses, service CPU, deltas of Envoy's ext_proc stats, of the
extproc cluster's stats and of the service's phase CPU / decision histogram. One JSON line per round on stdout and
a summary at the end. Which code runs is whatever `extproc` imports first (set PYTHONPATH to an archived tree to
measure another commit; the service inherits it).

    PYTHONPATH=TREE python reports/suite-s13/repro_item4.py --busy 2 --rounds 5 [--attackers 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

import extproc
from extproc.bench.loadgen import RequestSpec, run_open_loop
from extproc.bench.procs import ProcessGroup, cpu_seconds
from tests.integration.security.helpers import POOLS, chat, key, keys_file, policy
from tests.support import launch_stack

HOSTILE = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}] * 100_000}).encode()


async def envoy_stats(http: aiohttp.ClientSession, admin: str) -> dict[str, float]:
    async with http.get(f"{admin}/stats?format=json") as response:
        found = await response.json(content_type=None)
    out: dict[str, float] = {}
    for stat in found.get("stats", []):
        name, value = stat.get("name", ""), stat.get("value")
        if isinstance(value, int | float) and ("ext_proc" in name or "extproc" in name):
            out[name] = float(value)
    return out


async def service_metrics(http: aiohttp.ClientSession, admin: str) -> dict[str, float]:
    async with http.get(f"{admin}/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("extproc_phase_cpu_seconds_total", "extproc_decision_seconds_sum",
                            "extproc_decision_seconds_count", "extproc_requests_total", "extproc_tenant_refusals")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 4) for k, v in after.items() if v - before.get(k, 0.0)}


async def attack_round(http: aiohttp.ClientSession, stack: Any, service_pid: int, attackers: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{stack.envoy_port}/v1/chat/completions"
    attacker = {"content-type": "application/json", "authorization": f"Bearer {key('attacker')}"}
    statuses: list[int] = []
    bodies: list[str] = []
    stop = time.monotonic() + 3.0

    async def attack() -> None:  # closed loop, like the test
        while time.monotonic() < stop:
            try:
                async with http.post(url, data=HOSTILE, headers=attacker) as response:
                    statuses.append(response.status)
                    text = await response.text()
                    if len(bodies) < 3 and text not in bodies:
                        bodies.append(text[:200])
            except aiohttp.ClientError:
                statuses.append(0)

    headers = (("content-type", "application/json"), ("authorization", f"Bearer {key('victim')}"))
    body = json.dumps(chat(max_tokens=4)).encode()
    before_env = await envoy_stats(http, stack.envoy_admin_url)
    before_svc = await service_metrics(http, stack.admin_url)
    pids = {name: child.pid for name, child in stack.children.items()}
    others_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    cpu_before, wall_before = cpu_seconds(service_pid), time.monotonic()
    victims = asyncio.create_task(run_open_loop(
        "127.0.0.1", stack.envoy_port, lambda i: RequestSpec("POST", "/v1/chat/completions", headers, body),
        rate=20, duration_s=3.0, arrival="fixed", timeout_s=10))
    await asyncio.gather(*(attack() for _ in range(attackers)))
    samples = await victims
    wall = time.monotonic() - wall_before
    cpu = cpu_seconds(service_pid) - cpu_before
    cores = {name: round((cpu_seconds(pid) - others_before[name]) / wall, 3) for name, pid in pids.items()}
    await asyncio.sleep(0.5)  # Envoy's stats settle (a script, not a test)
    env = delta(await envoy_stats(http, stack.envoy_admin_url), before_env)
    svc = delta(await service_metrics(http, stack.admin_url), before_svc)
    e2e = sorted(s.e2e_s for s in samples)
    return {
        "victims": dict(Counter(s.status for s in samples)), "victim_e2e_ms_p50_max": [
            round(e2e[len(e2e) // 2] * 1000, 1), round(e2e[-1] * 1000, 1)] if e2e else None,
        "attackers_statuses": dict(Counter(statuses)), "hostile_sent": len(statuses), "attacker_bodies": bodies,
        "service_cores": round(cpu / wall, 3), "service_cpu_ms_per_hostile": round(cpu * 1000 / max(1, len(statuses)), 1),
        "cores": cores, "envoy": env, "service": svc,
    }


async def main(args: argparse.Namespace) -> None:
    print(f"extproc from {Path(extproc.__file__).parent}; busy {args.busy}; rounds {args.rounds}", file=sys.stderr)
    busy: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="s13-item4-"))
    (workdir / "keys.json").write_text(keys_file())
    rows = []
    try:
        async with ProcessGroup(workdir / "logs") as group, aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=60)) as http:
            stack = await launch_stack(group, workdir, POOLS, extra_policy=policy(str(workdir / "keys.json")),
                                       sim_args=["--profile", "fast"])
            for _ in range(args.busy):
                # Each in its own session, like the stack's processes: with autogroup scheduling (on here) the
                # kernel shares CPU between sessions first, so busy loops in this script's session would only
                # compete with this script.
                busy.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True))
            print(f"busy pids {[p.pid for p in busy]}", file=sys.stderr)
            for index in range(args.rounds):
                row = await attack_round(http, stack, stack.children["service"].pid, args.attackers)
                row["round"] = index
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    victims = Counter[int]()
    for row in rows:
        victims.update({int(k): v for k, v in row["victims"].items()})
    failed_rounds = sum(1 for r in rows if set(r["victims"]) != {200})
    print(json.dumps({"summary": True, "busy": args.busy, "attackers": args.attackers, "rounds": len(rows), "victims": dict(victims),
                      "rounds_with_a_victim_not_200": failed_rounds,
                      "victim_e2e_ms_p50_per_round": [r["victim_e2e_ms_p50_max"][0] for r in rows if r["victim_e2e_ms_p50_max"]],
                      "victim_e2e_ms_max_per_round": [r["victim_e2e_ms_p50_max"][1] for r in rows if r["victim_e2e_ms_p50_max"]],
                      "hostile_sent": sum(r["hostile_sent"] for r in rows),
                      "attacker_statuses": dict(sum((Counter(r["attackers_statuses"]) for r in rows), Counter())),
                      "pythonpath": os.environ.get("PYTHONPATH")}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--attackers", type=int, default=8, help="0: the victims alone (a baseline)")
    asyncio.run(main(parser.parse_args()))
