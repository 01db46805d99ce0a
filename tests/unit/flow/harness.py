"""A fleet of simulated engines behind the gateway's flow control, in virtual time, without sockets.

The real pieces: the simulator's step scheduler (`extproc.sim.engine`), the load model
(`extproc.endpoints.load`) fed by periodic scrapes of the engines' reported gauges, and the
`FlowController`. What the gateway's stream handling does is reduced to its effect: a lease per routed
request (in-flight count) released the moment the engine finishes it, and a kick of the flow controller then.
Every event runs at its virtual time, so a minute of traffic takes a fraction of a second of CPU.

With `replicas` > 1, each service replica has its own flow controller and its own view of every engine (its
own leases, its own scrapes at its own phase), requests reach the replicas in turn (as Envoy's round robin over
the ext_proc cluster), and every `sync_s` each replica publishes its in-flight counts and reads the others'
(`extproc.server.fleet`), then kicks its queue. With `share`, each engine is scraped by one replica only, which
publishes the scrape at its next exchange; the others adopt it at theirs (`extproc.server.scrape_share`).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from extproc.config.schema import SaturationConfig
from extproc.endpoints import Endpoint, EndpointMetrics, EndpointRegistry
from extproc.endpoints.load import LoadModel
from extproc.flow import GO, FlowControlConfig, FlowController, Rejected, Room, Ticket
from extproc.server.scrape_share import ScrapeShare
from extproc.sim.engine import Engine, GenRequest, RequestState, Step
from extproc.sim.profile import Profile


class Handle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualTime:
    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Handle, Callable[[], None]]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        heapq.heappush(self._events, (max(when, self.now), next(self._seq), handle, callback))
        return handle

    def call_later(self, delay: float, callback: Callable[[], None]) -> Handle:
        return self.call_at(self.now + delay, callback)

    def run(self, until: float, after_event: Callable[[], None]) -> None:
        while self._events and self._events[0][0] <= until:
            when, _, handle, callback = heapq.heappop(self._events)
            if handle.cancelled:
                continue
            self.now = when
            callback()
            after_event()
        self.now = until


@dataclass
class Node:
    """One engine, each service replica's view of it (`endpoints[r]`), and its step loop."""

    engine: Engine
    endpoints: list[Endpoint]
    stepping: bool = False

    @property
    def endpoint(self) -> Endpoint:
        """The first replica's view (the only one with one replica)."""
        return self.endpoints[0]

    @property
    def in_flight(self) -> int:
        return sum(endpoint.in_flight for endpoint in self.endpoints)


@dataclass
class Replica:
    """One service replica: its flow controller, its endpoints (a registry: the scrape share reads it) and what it
    last published to the others."""

    flow: FlowController
    registry: EndpointRegistry
    share: ScrapeShare | None = None
    published: dict[str, int] = field(default_factory=dict)  # address -> in-flight count, at its last exchange
    routed: list[int] = field(default_factory=list)  # requests routed per node


@dataclass
class Outcome:
    served: int = 0
    refused: list[Rejected] = field(default_factory=list)
    held: int = 0
    violations: list[str] = field(default_factory=list)


class FlowFleet:
    """`offer(...)` requests as the gateway would; `run(until)` advances everything."""

    SCRAPE_S = 0.1

    def __init__(self, profile: Profile, engines: int, flow: FlowControlConfig, saturation: SaturationConfig,
                 seats: int | None, reserves: dict[str, float], *, replicas: int = 1, sync_s: float = 0.01,
                 share: bool = False) -> None:
        self.time = VirtualTime()
        self.profile = profile
        addresses = [f"10.0.0.{i}:8000" for i in range(engines)]
        self.replicas: list[Replica] = []
        for r in range(replicas):
            registry = EndpointRegistry()
            registry.adopt([("pool", addresses)])
            controller = FlowController(lambda: flow, functools.partial(self._room, r), self.time.clock,
                                        timer=self.time.call_later)
            controller.replicas = lambda: replicas
            scrapes = None
            if share:
                # As `extproc.server.stores`: a copy is at most a scrape interval plus two exchanges old.
                scrapes = ScrapeShare(registry, f"replica-{r}", 2.0 * (self.SCRAPE_S + sync_s),
                                      saturation=lambda: saturation, clock=self.time.clock)
                scrapes.live([f"replica-{i}" for i in range(replicas)])
            self.replicas.append(Replica(controller, registry, scrapes, routed=[0] * engines))
        self.nodes = [Node(Engine(profile, self.time.clock),
                           [replica.registry.snapshot()[address] for replica in self.replicas])
                      for address in addresses]
        self.load = LoadModel(saturation, stale_after_s=1.0, seats=seats)
        self.saturation = saturation
        # How stale the gateway's view of KV use and engine queues may be (with replicas: plus an exchange).
        self.tolerance_s = self.SCRAPE_S + profile.step_s(profile.max_num_seqs, profile.max_num_batched_tokens)
        if replicas > 1:
            self.tolerance_s += sync_s
        self.flow = self.replicas[0].flow
        self.reserves = reserves
        self.outcome = Outcome()
        self._turn = 0
        self._waiting: list[tuple[Ticket, GenRequest, int]] = []
        self._free_since: dict[Ticket, float] = {}  # held tickets some engine could take, since when
        for r in range(replicas):  # staggered scrapes, as independent scrape tasks (and processes) would be
            for i, node in enumerate(self.nodes):
                first = self.SCRAPE_S * ((i + 1) / engines + r / (engines * replicas))
                self.time.call_later(first, functools.partial(self._scrape, node, r))
            if replicas > 1:
                self.time.call_later(sync_s * (r + 1) / replicas, functools.partial(self._sync, r, sync_s))

    # -- the gateway's side ----------------------------------------------------------------------------

    def _room(self, replica: int, pool: str, now: float, reserve: float, enough: float) -> Room:
        return Room.of((self.load.room(node.endpoints[replica], now, reserve) for node in self.nodes), enough)

    def offer(self, request: GenRequest, klass: str) -> None:
        """The request reaches the next replica in turn (Envoy's round robin over the service replicas)."""
        replica = self._turn
        self._turn = (self._turn + 1) % len(self.replicas)
        flow = self.replicas[replica].flow
        verdict = flow.offer("pool", "tenant", klass, len(request.prompt_ids) + len(request.output_ids))
        if verdict == GO:
            self._route(request, replica)
        elif isinstance(verdict, Rejected):
            self.outcome.refused.append(verdict)
        else:
            assert isinstance(verdict, Ticket)
            self.outcome.held += 1
            self._waiting.append((verdict, request, replica))

    def _route(self, request: GenRequest, replica: int = 0) -> None:
        now = self.time.now
        nodes = self.nodes
        with_room = [n for n in nodes if (r := self.load.room(n.endpoints[replica], now)) is None or r > 0]
        node = min(with_room or nodes, key=lambda n: self.load.requests(n.endpoints[replica], now))
        endpoint = node.endpoints[replica]
        endpoint.in_flight += 1
        self.replicas[replica].routed[nodes.index(node)] += 1

        def progress(done: GenRequest) -> None:
            if done.state is RequestState.FINISHED:
                endpoint.in_flight -= 1  # the stream ended: the lease goes back
                self.outcome.served += 1
                self.replicas[replica].flow.finished("pool")

        request.on_progress = progress
        request.notify_every = 0
        node.engine.submit(request)
        if not node.stepping:
            self._begin(node)

    def _settle_tickets(self) -> None:
        still: list[tuple[Ticket, GenRequest, int]] = []
        for ticket, request, replica in self._waiting:
            if not ticket.settled:
                still.append((ticket, request, replica))
            elif ticket.granted:
                self._route(request, replica)
                self.replicas[replica].flow.routed(ticket)
            else:
                outcome = ticket.outcome
                assert outcome is not None
                self.outcome.refused.append(outcome)
        self._waiting = still

    def _sync(self, index: int, sync_s: float) -> None:
        """One replica's fleet exchange: publish its counts (and scrapes), read the others', kick its queue."""
        replica = self.replicas[index]
        now = self.time.now
        replica.published = {n.endpoints[index].address: n.endpoints[index].in_flight for n in self.nodes}
        others = [r for i, r in enumerate(self.replicas) if i != index]
        if replica.share is not None:
            published = {r.share.field: payload.encode() for r in others if r.share is not None
                         and (payload := r.share.payload(now, 1.0)) is not None}
            replica.share.adopt(published, now)
        for node in self.nodes:
            endpoint = node.endpoints[index]
            endpoint.others(sum(r.published.get(endpoint.address, 0) for r in others))
        replica.flow.kick_all()
        self.time.call_later(sync_s, lambda: self._sync(index, sync_s))

    # -- the engines' side -----------------------------------------------------------------------------

    def _begin(self, node: Node) -> None:
        step = node.engine.begin_step(self.time.now)
        node.stepping = step is not None
        if step is not None:
            self.time.call_later(step.duration_s, lambda: self._end(node, step))

    def _end(self, node: Node, step: Step) -> None:
        node.engine.end_step(step, self.time.now)
        self._begin(node)

    def _scrape(self, node: Node, index: int = 0) -> None:
        """One replica's scrape of one engine (as `extproc.endpoints.scraper`; skipped while a shared copy is
        fresh)."""
        replica = self.replicas[index]
        endpoint = node.endpoints[index]
        self.time.call_later(self.SCRAPE_S, lambda: self._scrape(node, index))
        if replica.share is not None and not replica.share.should_scrape(endpoint):
            return
        engine = node.engine
        gauges = engine.gauges(self.time.now)
        steps = engine.counters.histograms["vllm:iteration_tokens_total"]
        metrics = EndpointMetrics(scraped_at=self.time.now, running=gauges.running, waiting=gauges.waiting,
                                  kv_usage=gauges.kv_usage, preemptions=engine.counters.preemptions,
                                  step_tokens_buckets=tuple((float(b), float(c)) for b, c in steps.cumulative()))
        endpoint.scraped(metrics, endpoint.fleet_in_flight, self.saturation)
        if replica.share is not None:
            replica.share.scraped(endpoint, metrics)
        replica.flow.kick_all()

    # -- checks ----------------------------------------------------------------------------------------

    def _first_chunk_blocks(self, engine: Engine, request: GenRequest) -> int:
        return engine.kv.blocks_for(min(len(request.prompt_ids), self.profile.chunk_limit()))

    def free_for(self, klass: str, request: GenRequest) -> Node | None:
        """An engine that, in truth, would start the request at its next step: a seat this class may take, KV
        room for its first chunk, and no request waiting there already (first come, first served: a
        request that arrives behind a queue waits in it too, whatever the queue waits for)."""
        seats = math.floor(self.profile.max_num_seqs * (1.0 - self.reserves[klass]) + 1e-9)
        for node in self.nodes:
            engine = node.engine
            if (not engine.waiting and not engine.inbox and len(engine.running) < seats
                    and engine.kv.free_blocks >= self._first_chunk_blocks(engine, request)):
                return node
        return None

    def check(self) -> None:
        """After every event: a request held while some engine could take it, for longer than the gateway can
        know (one scrape interval, plus one engine step: vLLM's gauges are as of the last step), is a violation."""
        self._settle_tickets()
        now = self.time.now
        free_since = self._free_since
        self._free_since = {}
        for ticket, request, _ in self._waiting:
            node = self.free_for(ticket.klass, request)
            if node is None:
                continue
            since = self._free_since[ticket] = free_since.get(ticket, now)
            if now - since > self.tolerance_s:
                engine = node.engine
                self.outcome.violations.append(
                    f"t={now:.3f}: {ticket.klass} held for {now - since:.3f} s while {node.endpoint.address} holds "
                    f"{engine.requests_present()} of {self.profile.max_num_seqs} seats, "
                    f"{engine.kv.free_blocks} free blocks; the gateway saw "
                    f"load {self.load.requests(node.endpoint, self.time.now)} "
                    f"capacity {self.load.capacity(node.endpoint, self.time.now)} "
                    f"room {self.load.room(node.endpoint, self.time.now, self.reserves[ticket.klass])}")

    def run(self, until: float) -> None:
        self.time.run(until, self.check)
