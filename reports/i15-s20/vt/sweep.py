"""(session 20 copy of reports/i15-s17/vt/sweep.py: `%push_ms=M` now passes `push_s` to the harness, which pushes
request lines itself since session 17, instead of patching `RoutedFleet._share`; the pair load gate at 40%)
(session 17 copy: `%share_ms=N` sets the replicas' exchange interval (default 10); `%push_ms=M` delivers the
request lines (`~`) every M ms and the placements every N; booleans take 1/0)
(session 16 copy: `%replicas=N` shares every 10 ms, the new default placement_sync_ms)
(session 14 copy of reports/i15-s13/sweep.py: a variant's items `@NAME=value` set the module constant NAME of
`extproc.scheduling.cache_life` for that run (e.g. `@SHRINK=0`); the others are prefix-affinity-scorer overrides)
(session 13 copy of reports/i15-s12/sweep.py: the harness now feeds the scraped prefix-cache counters; adds
`gate`: when the KV-room gate first saw eviction (s, virtual), the share of checks with some endpoint evicting, and
the largest endpoint shortfall seen in the warm-up and after it, when the variant has the gate)
(session 12 copy of reports/routing-s9/drift/sweep.py: adds p50, the mean p90/p99 over seeds in brackets and
`cold`, measured requests that found under half their prompt cached)

prefix-affinity-scorer variants against issue 15's workloads in virtual time (tests/unit/scheduling/fleet_harness.py:
the real scheduler, the simulator's step engines, scrapes every 100 ms; TTFT is engine-side), several seeds, in
parallel processes. Prints one line per variant and workload: hit rate, TTFT p90 and p99 per seed, and the medians.

    .venv/bin/python reports/routing-s9/drift/sweep.py "" "load_slack=16" -- drift40 drift80 zipf40 zipf80 uniform80

Variants are prefix-affinity-scorer overrides (k=v,...; "" = defaults) or `sglang` (sglang_like.py routes instead);
workloads: NAME = drift|zipf|uniform|multi-turn|mixed + load percent (shared-prefix rates: 35.16 / 70.33 req/s at
40 / 80%; multi-turn and mixed: the bench's capacities). `--seeds 0,1,2,3` (default), `--jobs 2` (default).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_plan import MIXED_DOCUMENTS
from extproc.bench.routing_workloads import MixedPool, mixed_workload, multi_turn_workload, shared_prefix_workload
from extproc.scheduling import cache_life, kv_room
from extproc.scheduling.plugins import prefix_affinity
from tests.unit.scheduling import fleet_harness
from tests.unit.scheduling.fleet_harness import run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "routing-s9" / "drift"))
from sglang_like import SglangLike

WARMUP_S, DURATION_S = 5.0, 20.0
RATES = {"40": 35.16, "80": 70.33}
OTHER_RATES = {"multi-turn": 114.22, "mixed": 153.72}  # the bench's capacities for these workloads
POPULARITY = {"drift": "zipf:1.1", "zipf": "zipf:1.1", "uniform": "uniform"}
SCHEDULER = fleet_harness.Scheduler
CHECK = kv_room.KvRoom.check
GATE: list[tuple[float, bool, float]] = []  # (now, pool evicting, largest shortfall) after each check


def watched(self: kv_room.KvRoom, endpoints: Any, now: float) -> None:
    if now - self._checked_at < kv_room.CHECK_S:
        return
    CHECK(self, endpoints, now)
    GATE.append((now, self.pool_evicting, max((w.shortfall for w in self._watches.values()), default=0.0)))


kv_room.KvRoom.check = watched  # type: ignore[method-assign]
CONSTANTS = {k: v for k, v in vars(cache_life).items() if k.isupper() and isinstance(v, (int, float, bool))}
SHARE = fleet_harness.RoutedFleet._share


def pushed(placements_s: float) -> Any:
    """A `RoutedFleet._share` run every push interval: request lines delivered at once, placements held until the
    next multiple of `placements_s`."""
    held: dict[int, list[dict[str, list[str]]]] = {}
    due = [placements_s]

    def share(self: Any, every_s: float) -> None:
        exported = [{name: p.export_shared(self.time.now) for name, p in s.shared().items()} for s in self.schedulers]
        deliver_all = self.time.now >= due[0] - 1e-9
        if deliver_all:
            due[0] += placements_s
        for j, lines in enumerate(exported):
            held.setdefault(j, []).append({n: [x for x in ls if not x.startswith("~")] for n, ls in lines.items()})
        for i, scheduler in enumerate(self.schedulers):
            for j, lines in enumerate(exported):
                if i == j:
                    continue
                batches = [{n: [x for x in ls if x.startswith("~")] for n, ls in lines.items()}]
                if deliver_all:
                    batches = held[j] + batches
                for batch in batches:
                    for name, plugin in scheduler.shared().items():
                        plugin.import_shared(batch.get(name, []), self.time.now)
        if deliver_all:
            held.clear()
        self.time.call_later(every_s, lambda: share(self, every_s))

    return share


CREATE = prefix_affinity.create  # the unpatched factory: a worker process runs several variants in turn


def one(overrides: str, workload: str, seed: int) -> tuple[float, ...]:
    """One run; the variant `sglang` routes with `SglangLike` instead of our scheduler."""
    peer = overrides == "sglang"
    fleet_harness.Scheduler = (lambda *_a, **_k: SglangLike()) if peer else SCHEDULER  # type: ignore[assignment]
    overrides = "" if peer else overrides
    items = [item.split("=") for item in overrides.split(",") if item]
    replicas = int(dict(items).get("%replicas", "1"))  # service replicas sharing placements every %share_ms
    share_ms = float(dict(items).get("%share_ms", "10"))
    push_ms = float(dict(items).get("%push_ms", "0"))
    items = [item for item in items if not item[0].startswith("%")]
    for name, value in CONSTANTS.items():
        setattr(cache_life, name, value)
    for name, value in items:
        if name.startswith("@"):
            setattr(cache_life, name[1:], type(CONSTANTS[name[1:]])(float(value)))
    changes = dict((k, v) for k, v in items if not k.startswith("@"))
    def patched(name: str, parameters: Any) -> prefix_affinity.PrefixAffinityScorer:
        params = CREATE(name, parameters).params
        typed = {key: value == "1" if isinstance(getattr(params, key), bool) else type(getattr(params, key))(value)
                 for key, value in changes.items()}
        return prefix_affinity.PrefixAffinityScorer(name, dataclasses.replace(params, **typed))

    prefix_affinity.create = patched
    kind, load = workload[:-2], workload[-2:]
    rate = RATES[load]
    if kind in OTHER_RATES:
        rate = OTHER_RATES[kind] * int(load) / 100
        shared = multi_turn_workload("m", seed=seed) if kind == "multi-turn" else mixed_workload(
            (MixedPool("chat", "m", 1.0, documents=MIXED_DOCUMENTS),), seed=seed)
    else:
        shared = shared_prefix_workload(
            "m", groups=48, prefix_tokens=(3000, 3000), question_tokens=(300, 300), max_tokens=(100, 100),
            popularity=POPULARITY[kind], seed=seed,
            drift_after=round(rate * (WARMUP_S + DURATION_S / 2)) if kind == "drift" else None)
    GATE.clear()
    r = run(shared.next_spec, rate, endpoints=8, kv_blocks=kv_blocks_for(shared.prefix_working_set_tokens["chat"], 8),
            warmup_s=WARMUP_S, duration_s=DURATION_S, seed=seed, replicas=replicas,
            share_s=share_ms / 1000 if replicas > 1 else None,
            push_s=push_ms / 1000 if replicas > 1 and push_ms else None)
    return (r.hit_rate, r.ttft_percentile(90) * 1e3, r.ttft_percentile(99) * 1e3, r.ttft_percentile(50) * 1e3,
            r.cold, *gate())


def gate() -> tuple[float, float, float, float]:
    on = [t for t, e, _ in GATE if e]
    early = [f for t, _, f in GATE if t < WARMUP_S]
    late = [f for t, _, f in GATE if t >= WARMUP_S]
    return (on[0] if on else -1.0, len(on) / max(1, len(GATE)), max(early, default=0.0), max(late, default=0.0))


def main(argv: list[str]) -> None:
    seeds, jobs = [0, 1, 2, 3], 2
    while argv and argv[0] in ("--seeds", "--jobs"):
        if argv[0] == "--seeds":
            seeds = [int(s) for s in argv[1].split(",")]
        else:
            jobs = int(argv[1])
        argv = argv[2:]
    split = argv.index("--")
    variants, workloads = argv[:split], argv[split + 1:]
    with ProcessPoolExecutor(jobs) as pool:
        futures = {(v, w, s): pool.submit(one, v, w, s) for w in workloads for v in variants for s in seeds}
        for w in workloads:
            for v in variants:
                rows = [futures[(v, w, s)].result() for s in seeds]
                hit, p90, p99, p50, cold = (statistics.median(r[k] for r in rows) for k in range(5))
                mean90, mean99 = (statistics.mean(r[k] for r in rows) for k in (1, 2))
                seeded = " ".join(f"{r[1]:.1f}/{r[2]:.1f}" for r in rows)
                print(f"{w:10} {v or 'defaults':44} hit {hit:.4f} p50 {p50:5.1f} p90 {p90:6.1f} ({mean90:6.1f}) "
                      f"p99 {p99:6.1f} ({mean99:6.1f}) cold {cold:4.0f} | p90/p99 {seeded} | "
                      f"hit {' '.join(f'{r[0]:.4f}' for r in rows)} | cold {' '.join(str(r[4]) for r in rows)} | "
                      f"gate {' '.join(f'{r[5]:.1f}/{r[6]:.2f}/{r[7]:.3f}/{r[8]:.3f}' for r in rows)}",
                      flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
