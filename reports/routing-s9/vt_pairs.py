"""Multi-turn 80% in virtual time: which system prompts share an engine, 1 vs 3 replicas
(tests/unit/scheduling/fleet_harness.py).

    .venv/bin/python reports/routing-s9/vt_pairs.py
"""
import sys

sys.path.insert(0, "/work/wt/routing")
from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import multi_turn_workload
from tests.unit.scheduling.fleet_harness import run

for seed in (0, 1):
    for replicas in (1, 3):
        work = multi_turn_workload("m", seed=seed)
        kv = kv_blocks_for(work.prefix_working_set_tokens["chat"], 8)
        r = run(work.next_spec, 91.38, endpoints=8, kv_blocks=kv, seed=seed, replicas=replicas,
                share_s=0.05 if replicas > 1 else None)
        pairs = sorted(tuple(sorted(int(g) for g, homes in r.homes.items() if i in homes)) for i in range(8))
        print(f"seed {seed} replicas {replicas}: p90 {r.ttft_percentile(90) * 1e3:.1f} "
              f"p99 {r.ttft_percentile(99) * 1e3:.1f}; system prompts per engine {pairs}")
