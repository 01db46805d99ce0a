"""Virtual time, 0.9x, 1 and 3 service replicas: flow control on vs off per seed and pooled over the seeds, and every
request flow control held, classified by the gate that held it (tests/unit/flow/harness.py; the overload mix of
tests/unit/flow/test_overload_priority.py: 4 h100-8b engines, seats learned, 8 s at 1.5x, 12 s idle, 15 s measured).

Gates, first that applies at the moment of the hold (this replica's view, `LoadModel`/`FlowController` state):
- ahead: the class had room, but a request of a class at least as high (same or smaller reserve) was queued;
- reserve: room for a class keeping no reserve, none for this class's reserve (reserves applied: latched / seats
  freed slowly / a queue held >= 1 s);
- kv / queueing / capacity: no room even without a reserve, because of the endpoints' KV rule, their engine-queue
  verdict (a queue lasting sustain_ms) or their capacity (learned seats minus the estimated load);
and for each hold the pool's true free seats (max_num_seqs - running - waiting at every engine, summed) and the
gateway's overcount (estimated load - true load, summed over the engines).

Run: PYTHONPATH=. .venv/bin/python reports/i13-s11/holds_vt.py [--sync S] [--replicas 1,3] SEEDS...
"""

from __future__ import annotations

import argparse
import collections
import random
from typing import Any

from extproc.config.schema import SaturationConfig
from extproc.flow import FlowControlConfig, Ticket
from extproc.flow.controller import _kept
from extproc.sim.engine import GenRequest
from extproc.sim.profile import BUILTIN_PROFILES
from tests.unit.flow.harness import FlowFleet

MIX = {"critical": 0.15, "standard": 0.5, "sheddable": 0.35}
PROMPT = 110
ENGINES = 4
WARM = [(1.5, 8.0, False), (0.0, 12.0, False)]


def classify(fleet: FlowFleet, replica: int, klass: str) -> dict[str, Any]:
    flow = fleet.replicas[replica].flow
    pool = flow._pool("pool")
    now = fleet.time.now
    if pool.queue:
        flow._dispatch("pool", pool, now)  # as `offer` does first (at the same moment: changes nothing else)
        fleet._settle_tickets()
    spec = flow.config.classes[klass]
    reserving = flow._reserving(pool, now)
    kept = _kept(spec.reserve, reserving, bool(pool.queue))
    load = fleet.load
    eps = [n.endpoints[replica] for n in fleet.nodes]
    room0 = sum((load.room(e, now, 0.0) or 0.0) for e in eps)
    roomk = sum((load.room(e, now, kept) or 0.0) for e in eps)
    seats = fleet.profile.max_num_seqs
    true_free = 0
    over = 0.0
    why = []
    for node, e in zip(fleet.nodes, eps):
        eng = node.engine
        present = len(eng.running) + len(eng.waiting) + len(eng.inbox)
        true_free += max(0, seats - present)
        over += load.requests(e, now) - present
        m = load.fresh(e, now)
        if (load.room(e, now, 0.0) or 0.0) <= 0 and m is not None:
            if m.kv_usage >= load._config.max_kv_utilization and m.waiting > 0:
                why.append("kv")
            elif load.queueing(e) and max(0.0, 1.0 - (m.waiting + load.sent_since(e))) <= 0:
                why.append("queueing")
            else:
                why.append("capacity")
    if pool.queue and roomk - pool.pending > 0:
        gate = "ahead"
    elif reserving and room0 - pool.pending > 0:
        gate = "reserve:" + ("latched" if pool.latched else "slow" if flow._freed_slowly(pool, now) else "held1s")
    elif why:
        gate = "+".join(sorted(set(why)))
    else:
        gate = "pending"  # room only for the grants not yet routed
    caps = [e.engine.capacity for e in eps]
    return {"gate": gate, "true_free": true_free, "room0": room0, "roomk": roomk, "pending": pool.pending,
            "queued": len(pool.queue), "over": over, "class": klass, "caps": caps}


def point(load: float, flow: bool, seed: int, replicas: int, sync_s: float, share: bool = False
          ) -> tuple[dict[str, list[float]], int, list[dict[str, Any]], int]:
    profile = BUILTIN_PROFILES["h100-8b"]
    capacity = ENGINES * profile.capacity_rps(PROMPT, 96)
    config = FlowControlConfig()
    fleet = FlowFleet(profile, ENGINES, config, SaturationConfig(), None,
                      {name: spec.reserve for name, spec in config.classes.items()}, replicas=replicas, sync_s=sync_s,
                      share=share)
    rng = random.Random(seed)
    measured: list[tuple[GenRequest, str, float]] = []
    holds: list[dict[str, Any]] = []
    marks: list[int] = []
    at = 0.0
    index = 0
    turn = [0]
    measuring = [False]

    def offer_off(request: GenRequest) -> None:
        fleet._route(request, turn[0])
        turn[0] = (turn[0] + 1) % replicas

    def offer_on(request: GenRequest, klass: str) -> None:
        replica = fleet._turn
        diag = classify(fleet, replica, klass) if measuring[0] else None
        before = len(fleet._waiting)
        fleet.offer(request, klass)
        if diag is not None and len(fleet._waiting) > before:
            ticket: Ticket = fleet._waiting[-1][0]
            diag["ticket"] = ticket
            diag["at"] = fleet.time.now
            holds.append(diag)

    for rate, length, keep in [*WARM, (load, 15.0, True)]:
        end = at + length
        if keep:
            fleet.time.call_at(at, lambda: measuring.__setitem__(0, True))

            def reset() -> None:
                for replica in fleet.replicas:
                    pool = replica.flow._pool("pool")
                    if hasattr(pool, "longest_held_s"):  # not in main's controller (9e990b3)
                        pool.longest_held_s = 0.0
            fleet.time.call_at(at, reset)
        if rate > 0:
            while (at := at + rng.expovariate(rate * capacity)) < end:
                klass = rng.choices(list(MIX), list(MIX.values()))[0]
                base = 20_000 * (index := index + 1)
                request = GenRequest(f"r{index}", list(range(base, base + PROMPT)), list(range(rng.randint(64, 128))))
                if keep:
                    measured.append((request, klass, at))
                fleet.time.call_at(at, lambda r=request, k=klass: offer_on(r, k) if flow else offer_off(r))
        at = end
        fleet.time.call_at(at, lambda: marks.append(len(fleet.outcome.refused)))
    fleet.run(at + 30.0)
    ttft: dict[str, list[float]] = {klass: [] for klass in MIX}
    for request, klass, offered in measured:
        if request.first_token_at > 0:
            ttft[klass].append(request.first_token_at - offered)
    for h in holds:
        t: Ticket = h.pop("ticket")
        h["waited"] = (t.outcome.waited_s if t.outcome is not None else None) if not t.granted else None
    point.longest = max(getattr(r.flow._pool("pool"), "longest_held_s", 0.0)  # type: ignore[attr-defined]
                        for r in fleet.replicas)
    return ttft, len(fleet.outcome.refused) - marks[1], holds, len(measured)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sync", type=float, default=0.02)
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--share", action="store_true", help="shared scrapes (scheduling.scrape.share)")
    parser.add_argument("--detail", action="store_true", help="print the gate of every hold")
    parser.add_argument("seeds", nargs="*", type=int)
    args = parser.parse_args()
    seeds = args.seeds or list(range(1, 13))
    for replicas in [int(r) for r in args.replicas.split(",")]:
        pooled: dict[bool, dict[str, list[float]]] = {True: collections.defaultdict(list),
                                                     False: collections.defaultdict(list)}
        gates: collections.Counter[str] = collections.Counter()
        gates_free: collections.Counter[str] = collections.Counter()
        print(f"\n### {replicas} replica(s), {args.load}x, exchange {args.sync * 1000:.0f} ms"
              f"{', shared scrapes' if args.share else ''}\n")
        print("| seed | on crit | std | shed | off crit | std | shed | refused | held | held with true free seats | longest queue (s) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        total_refused = 0
        for seed in seeds:
            on, refused, holds, _ = point(args.load, True, seed, replicas, args.sync, args.share)
            longest = point.longest  # type: ignore[attr-defined]
            off, _, _, _ = point(args.load, False, seed, replicas, args.sync, args.share)
            total_refused += refused
            for k in MIX:
                pooled[True][k] += on[k]
                pooled[False][k] += off[k]
            free = 0
            for h in holds:
                gates[h["gate"]] += 1
                if h["true_free"] > 0:
                    gates_free[h["gate"]] += 1
                    free += 1
                if args.detail:
                    print(f"  seed {seed} t={h['at']:.3f} {h['class']} {h['gate']} true_free={h['true_free']} "
                          f"over={h['over']:.1f} caps={h['caps']} room0={h['room0']} roomk={h['roomk']} pending={h['pending']} "
                          f"queued={h['queued']}")
            cells = " | ".join(f"{p99(t[k]) * 1000:.0f}" for t in (on, off) for k in MIX)
            print(f"| {seed} | {cells} | {refused} | {len(holds)} | {free} | {longest:.2f} |", flush=True)
        ratios = " | ".join(f"{p99(pooled[True][k]) * 1000:.1f} / {p99(pooled[False][k]) * 1000:.1f} "
                            f"({p99(pooled[True][k]) / p99(pooled[False][k]) - 1:+.1%})" for k in MIX)
        print(f"\npooled p99 on / off: {ratios}; refused {total_refused}")
        print(f"holds by gate: {dict(gates.most_common())}")
        print(f"holds with true free seats, by gate: {dict(gates_free.most_common())}")


if __name__ == "__main__":
    main()
