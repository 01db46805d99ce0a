import sys, json
sys.path.insert(0, '.')
from tests.unit.scheduling import fleet_harness as fh
from tests.unit.scheduling.test_placement_in_virtual_time import workload
from extproc.sim.engine import RequestState

events = []
orig_offer = fh.RoutedFleet.offer
def offer(self, spec):
    # which replica: replicate rng draw ordering by peeking
    state = self._replica_rng.getstate()
    r = self._replica_rng.randrange(len(self.schedulers))
    self._replica_rng.setstate(state)
    before = {i: len(n.engine.waiting) + len(n.engine.running) for i, n in enumerate(self.nodes)} if False else None
    n0 = [len(getattr(n.engine, 'requests', [])) for n in self.nodes]
    subs = []
    for i, node in enumerate(self.nodes):
        orig = node.engine.submit
        def sub(g, i=i, orig=orig):
            subs.append((i, g))
            return orig(g)
        node.engine.submit = sub
    orig_offer(self, spec)
    for node in self.nodes:
        del node.engine.submit
    i, g = subs[0]
    t = self.time.now
    group = spec.labels.get("group")
    prev = g.on_progress
    def progress(done, prev=prev):
        prev(done)
        if done.state is RequestState.FINISHED and 2 * done.cached_tokens < len(done.prompt_ids) and t >= self.measure_from:
            events.append((round(t, 3), r, i, group))
    g.on_progress = progress
fh.RoutedFleet.offer = offer
next_spec, kv = workload("uniform")
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
res = fh.run(next_spec, 70.33, endpoints=8, kv_blocks=kv, warmup_s=5.0, duration_s=20.0, seed=seed, replicas=3, share_s=0.05)
print("cold", res.cold, "hit", round(res.hit_rate, 4))
for e in sorted(events): print(e)
