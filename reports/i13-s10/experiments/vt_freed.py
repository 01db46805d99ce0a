"""Experiment: every replica learns every completion at once (an oracle freed rate)."""
import sys
sys.argv = [sys.argv[0]]
import tests.unit.flow.harness as h
from extproc.sim.engine import RequestState
orig_init = h.FlowFleet.__init__
def init(self, *a, **k):
    orig_init(self, *a, **k)
    for r in self.replicas:
        r.flow.replicas = lambda: 1
h.FlowFleet.__init__ = init
orig_route = h.FlowFleet._route
def route(self, request, replica=0):
    orig_route(self, request, replica)
    inner = request.on_progress
    def progress(done):
        inner(done)
        if done.state is RequestState.FINISHED:
            for i, r in enumerate(self.replicas):
                if i != replica:
                    r.flow.finished("pool")
    request.on_progress = progress
h.FlowFleet._route = route
sys.path.insert(0, "reports/i13-s10")
import replicas_vt
from extproc.flow import FlowControlConfig
for seed in (1, 3, 6):
    for replicas, share in ((3, False),):
        on, refused, held, violations = replicas_vt.point(0.9, True, seed, replicas, share)
        off, *_ = replicas_vt.point(0.9, False, seed, replicas, share)
        cells = " | ".join(f"{replicas_vt.p99(t[k]) * 1000:.0f}" for t in (on, off) for k in replicas_vt.MIX)
        print(f"| {seed} | {replicas} | {share} oracle-freed | {cells} | {refused} | {held} | {violations} |", flush=True)
