import sys
sys.path.insert(0, '.')
from tests.unit.scheduling import fleet_harness as fh
from extproc.scheduling.plugins import prefix_affinity as pa
from tests.unit.scheduling.test_placement_in_virtual_time import workload
orig = pa.PrefixAffinityScorer._pick_home
mode = sys.argv[1]
def pick(self, pairs, request, follow, addresses, depth, loads, rank, anchor):
    if mode == "load":
        return min(follow, key=lambda i: (loads[i], -rank[i]))
    if mode == "backlog":
        t = [self.backlog.tokens(a, request.now) for a in addresses]
        return min(follow, key=lambda i: (t[i], loads[i], -rank[i]))
    if mode == "norefresh":
        saved = pairs.refresh_s; pairs.refresh_s = 1e9
        try: return orig(self, pairs, request, follow, addresses, depth, loads, rank, anchor)
        finally: pairs.refresh_s = saved
    return orig(self, pairs, request, follow, addresses, depth, loads, rank, anchor)
pa.PrefixAffinityScorer._pick_home = pick
for seed in (0, 1):
    next_spec, kv = workload("uniform")
    r = fh.run(next_spec, 70.33, endpoints=8, kv_blocks=kv, warmup_s=5.0, duration_s=20.0, seed=seed)
    print(mode, seed, "cold", r.cold, "hit", round(r.hit_rate, 4), "p90", round(r.ttft_percentile(90)*1000,1), "p99", round(r.ttft_percentile(99)*1000,1), flush=True)
