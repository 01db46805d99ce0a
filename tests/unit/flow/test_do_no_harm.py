"""Below saturation flow control must be invisible: checked against the engines' true state, not the gateway's.

Random engine profiles (step budget 512-8,192 tokens, 8-256 seats, KV from a few sequences' worth to plenty),
prompts of 50-8,000 tokens, outputs of 1-300, Poisson arrivals at 0.2-0.8 of the fleet's capacity, with the
pool's `max_num_seqs` configured or left to be learned. Flow control must refuse nothing, and never hold a
request while some engine would, in truth, start it at its next step: a seat its class may take (the class's
reserve applies: that is the policy, not a belief), KV room for its first prefill chunk, and no queue of its
own (a request arriving behind one waits in it, whatever it waits for). The gateway sees KV use and engine
queues only by scraping: a hold counts once it outlasts one scrape interval plus one engine step.
"""

from __future__ import annotations

import math
import random
import time

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from extproc.config.schema import SaturationConfig
from extproc.flow import FlowControlConfig
from extproc.sim.engine import GenRequest
from extproc.sim.profile import Profile
from tests.unit.flow.harness import FlowFleet

FLOW = FlowControlConfig()  # the default classes: critical (no reserve), standard (10%), sheddable
RESERVES = {name: spec.reserve for name, spec in FLOW.classes.items()}
REQUESTS = 600


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Profile, int, bool, float, int]:
    budget = draw(st.sampled_from([512, 1024, 2048, 4096, 8192]))
    seats = draw(st.sampled_from([8, 16, 32, 64, 128, 256]))
    max_model_len = 8192 + 512
    blocks = draw(st.integers(min_value=max_model_len // 16 * 2, max_value=40_000))
    profile = Profile(name="random", max_num_batched_tokens=budget, max_num_seqs=seats, num_gpu_blocks=blocks,
                      max_model_len=max_model_len, step_base_s=draw(st.sampled_from([0.004, 0.0065, 0.02])))
    engines = draw(st.integers(min_value=1, max_value=3))
    configured = draw(st.booleans())
    load = draw(st.floats(min_value=0.2, max_value=0.8))
    seed = draw(st.integers(min_value=0, max_value=2**31))
    return profile, engines, configured, load, seed


def _workload(seed: int) -> tuple[random.Random, list[tuple[int, int]]]:
    rng = random.Random(seed)
    # Prompt lengths log-uniform over 50-8,000 tokens, outputs uniform 1-300.
    shapes = [(int(math.exp(rng.uniform(math.log(50), math.log(8000)))), rng.randint(1, 300))
              for _ in range(REQUESTS)]
    return rng, shapes


@settings(max_examples=30, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_below_capacity_flow_control_refuses_nothing_and_holds_nothing_an_engine_could_take(
        scenario: tuple[Profile, int, bool, float, int]) -> None:
    profile, engines, configured, load, seed = scenario
    rng, shapes = _workload(seed)
    mean_prompt = sum(p for p, _ in shapes) / len(shapes)
    mean_output = sum(o for _, o in shapes) / len(shapes)
    rate = load * engines * profile.capacity_rps(round(mean_prompt), mean_output)
    fleet = FlowFleet(profile, engines, FLOW, SaturationConfig(), profile.max_num_seqs if configured else None,
                      RESERVES)
    at = 0.0
    for index, (prompt, output) in enumerate(shapes):
        at += rng.expovariate(rate)
        base = 1_000_000 * (index + 1)  # distinct prompts: no prefix cache help
        request = GenRequest(f"r{index}", list(range(base, base + prompt)), list(range(output)))
        klass = "critical" if rng.random() < 0.2 else "standard"
        fleet.time.call_at(at, lambda r=request, k=klass: fleet.offer(r, k))
    started = time.process_time()
    fleet.run(at + 600.0)
    print(f"{profile.max_num_seqs} seats, {profile.max_num_batched_tokens} budget, {engines} engines, "
          f"configured={configured}, load={load:.2f}: {time.process_time() - started:.2f} s CPU, "
          f"held {fleet.outcome.held}")
    outcome = fleet.outcome
    assert not outcome.refused, outcome.refused[:3]
    assert not outcome.violations, f"{len(outcome.violations)} violations: {outcome.violations[:3]}"
    assert outcome.served == REQUESTS
