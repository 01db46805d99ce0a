"""Simulated engines behind the real scheduler, in virtual time, without sockets.

The real pieces: the simulator's step engine (`extproc.sim.engine`) with its prefix cache, the chat template and
tokenizer it prompts with, the gateway's prefix hashing of the same request, the pool's load model fed by a scrape
of every engine every 100 ms, and one `Scheduler` per service replica with its plugins' state, exchanged between
replicas every `share_s` (as `extproc.server.placements` does through Redis) or never; with `push_s`, the requests
routed reach the other replicas that long after their routing instead (`extproc.server.request_push`). What Envoy
and the service's streams do is reduced to its effect: a request is in flight on its endpoint from its routing to
its last token.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from extproc.bench.loadgen import RequestSpec
from extproc.endpoints import Endpoint, EndpointMetrics
from extproc.endpoints.config import SaturationConfig
from extproc.endpoints.load import LoadModel
from extproc.openai.apis import Api
from extproc.openai.prompt import prompt_text
from extproc.scheduling import Scheduler, SchedulingRequest, prefix_blocks
from extproc.scheduling.config import SchedulingConfig
from extproc.sim.engine import Engine, GenRequest, RequestState, Step
from extproc.sim.profile import Profile, load_profile
from extproc.sim.tokens import Tokenizer, render_chat
from tests.unit.flow.harness import VirtualTime

SCRAPE_S = 0.1


@dataclass
class Node:
    engine: Engine
    endpoint: Endpoint
    stepping: bool = False


@dataclass
class Result:
    ttft_s: list[float] = field(default_factory=list)
    hit_tokens: int = 0
    prompt_tokens: int = 0
    requests: list[int] = field(default_factory=list)  # measured requests per endpoint
    homes: dict[str, set[int]] = field(default_factory=dict)  # label "group" -> endpoints it was sent to
    cold: int = 0  # measured requests that found less than half of their prompt cached

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens

    def ttft_percentile(self, q: float) -> float:
        ordered = sorted(self.ttft_s)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


class RoutedFleet:
    def __init__(self, profile: Profile, endpoints: int, *, replicas: int = 1, share_s: float | None = None,
                 push_s: float | None = None, profile_name: str = "default",
                 scheduling: SchedulingConfig | None = None) -> None:
        self.time = VirtualTime()
        self.nodes = [Node(Engine(profile, self.time.clock), Endpoint(f"10.0.0.{i}:8000")) for i in range(endpoints)]
        self.pool = tuple(n.endpoint for n in self.nodes)  # the pool's endpoint set, as the gateway names it
        self.load = LoadModel(SaturationConfig(), stale_after_s=1.0)
        unshared = replicas if share_s is None else 1
        self.schedulers = [Scheduler(scheduling or SchedulingConfig(), unshared_replicas=unshared)
                           for _ in range(replicas)]
        self.profile_name = profile_name
        self.tokenizer = Tokenizer(profile.vocab_size)
        self.result = Result(requests=[0] * endpoints)
        self.measure_from = 0.0
        self._sequence = 0
        self._replica_rng = random.Random(7)
        for i, node in enumerate(self.nodes):  # staggered scrapes, as independent scrape tasks would be
            self.time.call_later(SCRAPE_S * (i + 1) / endpoints, lambda n=node: self._scrape(n))
        if share_s is not None:
            for index, scheduler in enumerate(self.schedulers):
                for plugin in scheduler.shared().values():
                    plugin.export_shared(0.0)  # start recording
                    plugin.replica_slot(index, replicas)  # as `extproc.server.placements` tells them
                    if push_s is not None:
                        plugin.watch(lambda i=index: self._push_soon(i, push_s))
            self.time.call_later(share_s, lambda: self._share(share_s))
        self._push_s = push_s
        self._pushing = [False] * replicas

    def _push_soon(self, index: int, after_s: float) -> None:
        if not self._pushing[index]:
            self._pushing[index] = True
            self.time.call_later(after_s, lambda: self._push(index))

    def _push(self, index: int) -> None:
        self._pushing[index] = False
        lines = {name: p.export_perishable(self.time.now) for name, p in self.schedulers[index].shared().items()}
        for i, scheduler in enumerate(self.schedulers):
            if i != index:
                for name, plugin in scheduler.shared().items():
                    plugin.import_shared(lines.get(name, []), self.time.now)

    def _share(self, every_s: float) -> None:
        now = self.time.now
        exported = [{name: p.export_shared(now) + (p.export_perishable(now) if self._push_s is None else [])
                     for name, p in s.shared().items()} for s in self.schedulers]
        for i, scheduler in enumerate(self.schedulers):
            for j, lines in enumerate(exported):
                if i != j:
                    for name, plugin in scheduler.shared().items():
                        plugin.import_shared(lines.get(name, []), self.time.now)
        self.time.call_later(every_s, lambda: self._share(every_s))

    def _scrape(self, node: Node) -> None:
        gauges = node.engine.gauges(self.time.now)
        steps = node.engine.counters.histograms["vllm:iteration_tokens_total"]
        metrics = EndpointMetrics(scraped_at=self.time.now, running=gauges.running, waiting=gauges.waiting,
                                  kv_usage=gauges.kv_usage, preemptions=node.engine.counters.preemptions,
                                  prefix_queries=float(node.engine.counters.prefix_queries_tokens),
                                  prefix_hits=float(node.engine.counters.prefix_hits_tokens),
                                  block_size=gauges.block_size, num_gpu_blocks=gauges.num_gpu_blocks,
                                  step_tokens_buckets=tuple((float(b), float(c)) for b, c in steps.cumulative()))
        node.endpoint.scraped(metrics, node.endpoint.in_flight, SaturationConfig())
        self.time.call_later(SCRAPE_S, lambda: self._scrape(node))

    def offer(self, spec: RequestSpec) -> None:
        """Route one request now (a service replica Envoy picked at random) and submit it to its engine."""
        body = json.loads(spec.body)
        text = prompt_text(Api.CHAT, body)
        self._sequence += 1
        scheduler = self.schedulers[self._replica_rng.randrange(len(self.schedulers))]
        request = SchedulingRequest(model="m", prompt_tokens=len(text) // 4, max_output_tokens=body["max_tokens"],
                                    prefix_blocks=prefix_blocks(text), now=self.time.now, load=self.load,
                                    sequence=self._sequence, pool=self.pool)
        endpoints = list(self.pool)
        picked = scheduler.schedule(self.profile_name, request, endpoints, 1)[0]
        scheduler.profile(self.profile_name).observe(request, picked)
        index = endpoints.index(picked)
        node = self.nodes[index]
        ids = self.tokenizer.encode(render_chat(body["messages"]))
        generation = GenRequest(f"r{self._sequence}", ids, list(range(body["max_tokens"])))
        offered = self.time.now
        measured = offered >= self.measure_from
        lease = node.endpoint.lease()
        if measured:
            self.result.requests[index] += 1
            self.result.homes.setdefault(spec.labels.get("group", "-"), set()).add(index)

        def progress(done: GenRequest) -> None:
            if done.state is RequestState.FINISHED:
                lease.release()
                if measured:
                    self.result.ttft_s.append(done.first_token_at - offered)
                    self.result.hit_tokens += done.cached_tokens
                    self.result.cold += 2 * done.cached_tokens < len(done.prompt_ids)
                    self.result.prompt_tokens += len(done.prompt_ids)

        generation.on_progress = progress
        generation.notify_every = 0
        node.engine.submit(generation)
        if not node.stepping:
            self._begin(node)

    def _begin(self, node: Node) -> None:
        step = node.engine.begin_step(self.time.now)
        node.stepping = step is not None
        if step is not None:
            self.time.call_later(step.duration_s, lambda: self._end(node, step))

    def _end(self, node: Node, step: Step) -> None:
        node.engine.end_step(step, self.time.now)
        self._begin(node)


def run(next_spec: Callable[[int], RequestSpec], rate: float, *, endpoints: int, kv_blocks: int,
        warmup_s: float = 5.0, duration_s: float = 20.0, seed: int = 0, replicas: int = 1,
        share_s: float | None = None, push_s: float | None = None, scheduling: SchedulingConfig | None = None,
        profile_name: str = "default") -> Result:
    """Poisson arrivals at `rate` for warm-up + duration; the result counts the requests sent after warm-up."""
    profile = dataclasses.replace(load_profile("h100-8b"), num_gpu_blocks=kv_blocks)
    fleet = RoutedFleet(profile, endpoints, replicas=replicas, share_s=share_s, push_s=push_s,
                        profile_name=profile_name, scheduling=scheduling)
    fleet.measure_from = warmup_s
    rng = random.Random(seed)
    at, index = 0.0, 0
    while True:
        at += rng.expovariate(rate)
        if at >= warmup_s + duration_s:
            break
        spec = next_spec(index)
        index += 1
        fleet.time.call_at(at, lambda s=spec: fleet.offer(s))
    fleet.time.run(at + 60.0, lambda: None)
    return fleet.result
