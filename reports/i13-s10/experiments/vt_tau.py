"""Experiment: the freed-rate window scaled by the replica count."""
import math, sys
import extproc.flow.controller as c
mode = sys.argv[1]
if mode == "tau":
    def _freed_per_s(self, pool, now):
        tau = c.FREED_TAU_S * max(1, self.replicas())
        return pool.freed_per_s * math.exp(-max(0.0, now - pool.freed_at) / tau)
    def finished(self, pool_name):
        pool = self._pool(pool_name)
        now = self._clock()
        pool.freed_per_s = self._freed_per_s(pool, now) + 1.0 / (c.FREED_TAU_S * max(1, self.replicas()))
        pool.freed_at = now
        if pool.queue:
            self._dispatch(pool_name, pool, now)
    c.FlowController._freed_per_s = _freed_per_s
    c.FlowController.finished = finished
sys.path.insert(0, "reports/i13-s10")
import replicas_vt
for seed in [int(s) for s in sys.argv[2:]]:
    on, refused, held, violations = replicas_vt.point(0.9, True, seed, 3, False)
    off, *_ = replicas_vt.point(0.9, False, seed, 3, False)
    cells = " | ".join(f"{replicas_vt.p99(t[k]) * 1000:.0f}" for t in (on, off) for k in replicas_vt.MIX)
    print(f"| {seed} | 3 | {mode} | {cells} | {refused} | {held} |", flush=True)
