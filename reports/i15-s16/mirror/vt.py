"""Virtual time: uniform popularity at 80% (70.33 req/s, 8 engines, 48 x 3,000-token prefixes), one replica vs three
replicas exchanging every SHARE ms. Usage: vt.py CONFIG... where CONFIG is 1 (one replica) or 3@SHARE_MS or 3u@SHARE_MS
(unpaired); seeds 0-3 unless SEEDS=... . Prints per seed and pooled p90/p99 (engine-side TTFT, ms)."""
import os
import sys
sys.path.insert(0, '.')
from tests.unit.scheduling import fleet_harness as fh
from tests.unit.scheduling.test_placement_in_virtual_time import UNPAIRED, workload

if os.environ.get("OWNED") == "0":  # owned_first off
    from extproc.scheduling.plugins import prefix_affinity as pa
    pa.PrefixAffinityScorer._foreign = lambda self, request, addresses, loads, tokens: [False] * len(addresses)
if os.environ.get("AGE") == "sent":  # the least recently sent home by the family's last send, not the directory
    from extproc.scheduling.plugins import prefix_affinity as pa
    def _pick_home(self, pairs, request, follow, addresses, depth, loads, rank, anchor):
        room = self.room
        if len(follow) > 1:
            stale = pairs.stalest(anchor, [addresses[i] for i in follow], request.now)
            if stale is not None:
                return follow[stale]
        tokens = [self.backlog.tokens(a, request.now) for a in addresses]
        least = min(follow, key=lambda i: (pairs.last_sent(anchor, addresses[i]), -rank[i]))
        best = min(follow, key=lambda i: (tokens[i], loads[i], -rank[i]))
        return least if tokens[least] <= tokens[best] else best
    pa.PrefixAffinityScorer._pick_home = _pick_home
seeds = [int(s) for s in os.environ.get("SEEDS", "0,1,2,3").split(",")]
rate = float(os.environ.get("RATE", "70.33"))
pop = os.environ.get("POP", "uniform")
for config in sys.argv[1:]:
    reps, _, share = config.partition("@")
    unpaired = reps.endswith("u")
    reps_n = int(reps.rstrip("u"))
    pooled = []
    for seed in seeds:
        next_spec, kv = workload(pop)
        r = fh.run(next_spec, rate, endpoints=8, kv_blocks=kv, warmup_s=5.0, duration_s=20.0, seed=seed,
                   replicas=reps_n, share_s=float(share) / 1000 if share else None,
                   scheduling=UNPAIRED if unpaired else None, profile_name="unpaired" if unpaired else "default")
        pooled += r.ttft_s
        paired = sum(len(h) >= 2 for h in r.homes.values())
        print(f"{config} seed {seed}: paired {paired} cold {r.cold} hit {r.hit_rate:.4f} "
              f"p90 {r.ttft_percentile(90)*1000:.1f} p99 {r.ttft_percentile(99)*1000:.1f}", flush=True)
    pooled.sort()
    p = lambda q: pooled[min(len(pooled) - 1, int(q / 100 * len(pooled)))] * 1000
    print(f"{config} pooled: p90 {p(90):.1f} p99 {p(99):.1f}", flush=True)
