import sys, functools
sys.path.insert(0, "reports/i13-s10")
import tests.unit.flow.harness as h
sync = float(sys.argv[1])
h.FlowFleet.__init__ = functools.partialmethod(h.FlowFleet.__init__, sync_s=sync)
import replicas_vt
for seed in [int(s) for s in sys.argv[2:]]:
    on, refused, held, violations = replicas_vt.point(0.9, True, seed, 3, False)
    off, *_ = replicas_vt.point(0.9, False, seed, 3, False)
    cells = " | ".join(f"{replicas_vt.p99(t[k]) * 1000:.0f}" for t in (on, off) for k in replicas_vt.MIX)
    print(f"| {seed} | 3 | sync {sync*1000:.0f} ms | {cells} | {refused} | {held} |", flush=True)
