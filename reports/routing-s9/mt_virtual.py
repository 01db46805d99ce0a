"""Multi-turn (issue 15's `--workload multi-turn`) in virtual time: 1 vs N service replicas.

    .venv/bin/python reports/routing-s9/mt_virtual.py 91.38 0,1 1,3
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import multi_turn_workload
from tests.unit.scheduling.fleet_harness import run

ENDPOINTS, WARMUP_S, DURATION_S = 8, 5.0, 20.0


def main(rate: float, seeds: str, replica_counts: str) -> None:
    for seed in (int(s) for s in seeds.split(",")):
        for replicas in (int(r) for r in replica_counts.split(",")):
            work = multi_turn_workload("m", seed=seed)
            kv_blocks = kv_blocks_for(work.prefix_working_set_tokens["chat"], ENDPOINTS)
            r = run(work.next_spec, rate, endpoints=ENDPOINTS, kv_blocks=kv_blocks, warmup_s=WARMUP_S,
                    duration_s=DURATION_S, seed=seed, replicas=replicas, share_s=0.05 if replicas > 1 else None)
            print(f"seed {seed} replicas {replicas}: hit {r.hit_rate:.4f} TTFT p50 {r.ttft_percentile(50) * 1e3:.1f} "
                  f"p90 {r.ttft_percentile(90) * 1e3:.1f} p99 {r.ttft_percentile(99) * 1e3:.1f} ms; "
                  f"requests per engine {r.requests}", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2], sys.argv[3])
