"""VT: per variant, TTFT p90 and p99 (means over seeds) and the cold requests' TTFTs (count, median, p75, max, share
under 230 ms), shared-prefix shape of issue 15. Needs `arrival.diff` applied (the harness's `cold_ttft_s` and the
arrival parameters); run from that checkout's root:
    .venv/bin/python reports/i15-s23/vt/vtcold.py RATE POPULARITY SEEDS VARIANT...   (VARIANT: k=v,... or "")"""
import sys, dataclasses, statistics
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, '.')
from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import shared_prefix_workload
from extproc.scheduling.plugins import prefix_affinity
from tests.unit.scheduling.fleet_harness import run
CREATE = prefix_affinity.create
def one(args):
    overrides, rate, pop, seed = args
    items = [i.split('=') for i in overrides.split(',') if i]
    def patched(name, parameters):
        params = CREATE(name, parameters).params
        typed = {k: v == '1' if isinstance(getattr(params, k), bool) else type(getattr(params, k))(v) for k, v in items}
        return prefix_affinity.PrefixAffinityScorer(name, dataclasses.replace(params, **typed))
    prefix_affinity.create = patched
    shared = shared_prefix_workload("m", groups=48, prefix_tokens=(3000, 3000), question_tokens=(300, 300), max_tokens=(100, 100), popularity=pop, seed=seed)
    r = run(shared.next_spec, rate, endpoints=8, kv_blocks=kv_blocks_for(shared.prefix_working_set_tokens["chat"], 8), warmup_s=5.0, duration_s=20.0, seed=seed, replicas=1, share_s=None, push_s=None)
    return r.ttft_percentile(90)*1e3, r.ttft_percentile(99)*1e3, sorted(t*1e3 for t in r.cold_ttft_s), len(r.ttft_s)
if __name__ == '__main__':
    rate = float(sys.argv[1]); pop = sys.argv[2]; seeds = range(int(sys.argv[3])); variants = sys.argv[4:]
    with ProcessPoolExecutor(2) as ex:
        for v in variants:
            res = list(ex.map(one, [(v, rate, pop, s) for s in seeds]))
            colds = [t for r in res for t in r[2]]
            print(f"{v or 'defaults':40s} p90 {statistics.mean(r[0] for r in res):6.1f} p99 {statistics.mean(r[1] for r in res):6.1f} "
                  f"cold n {len(colds)} med {statistics.median(colds):.0f} p75 {sorted(colds)[int(.75*len(colds))]:.0f} max {max(colds):.0f} under230 {sum(c<230 for c in colds)/len(colds):.2f}")
