import sys
sys.path.insert(0, '.')
from tests.unit.scheduling import fleet_harness as fh
from extproc.scheduling.plugins import prefix_affinity as pa
from tests.unit.scheduling.test_placement_in_virtual_time import workload
for flags in sys.argv[1:]:
    pa.ANY_DECIDES, pa.SHARE_BACKLOG, pa.SCALE_REFRESH, pa.HOMES2 = (c == "1" for c in flags[:4])
    for seed in (0, 1):
        next_spec, kv = workload("uniform")
        reps = int(flags[-1]) if len(flags) > 4 else 3
        r = fh.run(next_spec, 70.33, endpoints=8, kv_blocks=kv, warmup_s=5.0, duration_s=20.0, seed=seed, replicas=reps, share_s=0.05 if reps > 1 else None)
        print(flags, seed, "paired", sum(len(h) >= 2 for h in r.homes.values()), "cold", r.cold, "hit", round(r.hit_rate, 4), "p90", round(r.ttft_percentile(90)*1000,1), "p99", round(r.ttft_percentile(99)*1000,1), flush=True)
        per = [0]*8
        for h in r.homes.values():
            for e in h: per[e] += 1
        print("   copies per endpoint", per, "requests", r.requests)
