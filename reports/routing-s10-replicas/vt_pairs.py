"""Multi-turn 80% in virtual time (tests/unit/scheduling/fleet_harness.py, the real scheduler and engines): which
system prompts share an engine with 1 and with 3 replicas, the smallest gap between two prompts sharing one (the
workload asks its 12 system prompts in turn, so prompts g and g+1 mod 12 arrive back to back), and the TTFT.

    .venv/bin/python reports/routing-s10-replicas/vt_pairs.py SEEDS [TREE]

TREE: a source tree to import instead of this one (e.g. `git archive main` unpacked), for before/after.
"""
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else str(Path(__file__).resolve().parents[2]))

from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import multi_turn_workload
from tests.unit.scheduling.fleet_harness import run

PROMPTS = 12


def gap(a: int, b: int) -> int:
    return min((a - b) % PROMPTS, (b - a) % PROMPTS)


for seed in (int(s) for s in sys.argv[1].split(",")):
    for replicas in (1, 3):
        work = multi_turn_workload("m", seed=seed)
        kv = kv_blocks_for(work.prefix_working_set_tokens["chat"], 8)
        r = run(work.next_spec, 91.38, endpoints=8, kv_blocks=kv, seed=seed, replicas=replicas,
                share_s=0.05 if replicas > 1 else None)
        groups = [sorted(int(g) for g, homes in r.homes.items() if i in homes) for i in range(8)]
        gaps = [gap(x, y) for g in groups for i, x in enumerate(g) for y in g[i + 1:]]
        print(f"seed {seed} replicas {replicas}: hit {r.hit_rate:.4f} p50 {r.ttft_percentile(50) * 1e3:.1f} "
              f"p90 {r.ttft_percentile(90) * 1e3:.1f} p99 {r.ttft_percentile(99) * 1e3:.1f}; min gap {min(gaps)}; "
              f"prompts per engine {[tuple(g) for g in groups]}", flush=True)
