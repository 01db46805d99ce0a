"""VT: what the slowest requests of one multi-turn seed are. Runs the virtual-time fleet (tests/unit/scheduling/
fleet_harness.py: the real scheduler on the simulator's step engines) on the multi-turn workload and prints the
measured requests above the seed's p98: arrival, endpoint, turn, prompt and cached tokens, TTFT, and what the
engine held when it arrived (running, waiting, uncached prefill tokens queued ahead).
    .venv/bin/python reports/i15-s24/vt/mttail.py LOAD SEED [TOP]       (LOAD 40|80)
The last line names the endpoints holding two system prompts adjacent in the old slot order (p, p + 1 mod 12)."""
import sys
sys.path.insert(0, '.')
from extproc.bench.routing_metrics import kv_blocks_for
from extproc.bench.routing_workloads import multi_turn_workload
from extproc.sim.engine import Engine
from tests.unit.scheduling import fleet_harness

ROWS: list[dict] = []
SUBMIT = Engine.submit
OFFER = fleet_harness.RoutedFleet.offer
CURRENT: dict = {}


def pending_prefill(engine: Engine) -> int:
    queued = [*engine.inbox, *engine.waiting, *engine.running]
    return sum(max(0, len(r.prompt_ids) - max(r.computed, r.cached_tokens)) for r in queued if r.generated == 0)


def submit(self: Engine, request) -> None:
    fleet = CURRENT["fleet"]
    index = next(i for i, n in enumerate(fleet.nodes) if n.engine is self)
    row = dict(at=fleet.time.now, ep=index, running=len(self.running), waiting=len(self.waiting) + len(self.inbox),
               ahead=pending_prefill(self), prompt=len(request.prompt_ids), **CURRENT["labels"])
    ROWS.append(row)
    user = request.on_progress

    def progress(done) -> None:
        if done.state.value == "finished":
            row["ttft"] = (done.first_token_at - row["at"]) * 1e3
            row["cached"] = done.cached_tokens
        if user:
            user(done)
    SUBMIT(self, request)
    request.on_progress = progress


def offer(self, spec) -> None:
    CURRENT["fleet"], CURRENT["labels"] = self, dict(spec.labels)
    OFFER(self, spec)


Engine.submit = submit
fleet_harness.RoutedFleet.offer = offer
load, seed = sys.argv[1], int(sys.argv[2])
top = int(sys.argv[3]) if len(sys.argv) > 3 else 0
shared = multi_turn_workload("m", seed=seed)
fleet_harness.run(shared.next_spec, 114.22 * int(load) / 100, endpoints=8,
                  kv_blocks=kv_blocks_for(shared.prefix_working_set_tokens["chat"], 8), seed=seed)
measured = [r for r in ROWS if r["at"] >= 5.0 and "ttft" in r]
ordered = sorted(measured, key=lambda r: r["ttft"])
p99 = ordered[int(0.99 * len(ordered))]["ttft"]
last_ep: dict[str, int] = {}
moved = set()
for r in sorted(ROWS, key=lambda r: r["at"]):
    c = r["conversation"]
    if c in last_ep and last_ep[c] != r["ep"]:
        moved.add(id(r))
    last_ep[c] = r["ep"]
print(f"seed {seed} load {load}%: {len(measured)} measured, p90 {ordered[int(.9*len(ordered))]['ttft']:.1f} p99 {p99:.1f}; "
      f"moved conversations {sum(id(r) in moved for r in measured)}, first turns {sum(r['turn']=='1' for r in measured)}")
n = top or max(1, len(ordered) // 50)
for r in sorted(ordered[-n:], key=lambda r: r["at"]):
    print(f"  t={r['at']:7.3f} ep{r['ep']} conv {r['conversation']:>4} turn {r['turn']:>2} prompt {r['prompt']:5d} cached {r['cached']:5d} "
          f"ttft {r['ttft']:5.1f} | at arrival running {r['running']:2d} waiting {r['waiting']} prefill ahead {r['ahead']:5d}"
          f"{' MOVED' if id(r) in moved else ''}")
per_ep = [0] * 8
for r in measured:
    per_ep[r["ep"]] += 1
tail_ep = [0] * 8
for r in ordered[-n:]:
    tail_ep[r["ep"]] += 1
print("  measured per endpoint", per_ep, "| tail per endpoint", tail_ep)
groups: dict[int, set[int]] = {}
for r in measured:
    groups.setdefault(r["ep"], set()).add(int(r["group"]))
print("  system prompts per endpoint", {ep: sorted(g) for ep, g in sorted(groups.items())})
n_sys = 12
adjacent = [(ep, sorted(g)) for ep, g in sorted(groups.items())
            if any((p + 1) % n_sys in g for p in g)]
print("  endpoints holding prompts p and p + 1 (mod 12):", adjacent or "none")
