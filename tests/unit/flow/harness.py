"""A fleet of simulated engines behind the gateway's flow control, in virtual time, without sockets.

The real pieces: the simulator's step scheduler (`extproc.sim.engine`), the load model
(`extproc.endpoints.load`) fed by periodic scrapes of the engines' reported gauges, and the
`FlowController`. What the gateway's stream handling does is reduced to its effect: a lease per routed
request (in-flight count) released the moment the engine finishes it, and a kick of the flow controller then.
Every event runs at its virtual time, so a minute of traffic takes a fraction of a second of CPU.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from extproc.config.schema import SaturationConfig
from extproc.endpoints import Endpoint, EndpointMetrics
from extproc.endpoints.load import LoadModel
from extproc.flow import GO, FlowControlConfig, FlowController, Rejected, Room, Ticket
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
    """One engine, its endpoint as the gateway sees it, and its step loop."""

    engine: Engine
    endpoint: Endpoint
    stepping: bool = False


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
                 seats: int | None, reserves: dict[str, float]) -> None:
        self.time = VirtualTime()
        self.profile = profile
        self.nodes = [Node(Engine(profile, self.time.clock), Endpoint(f"10.0.0.{i}:8000")) for i in range(engines)]
        self.load = LoadModel(saturation, stale_after_s=1.0, seats=seats)
        self.saturation = saturation
        # How stale the gateway's view of KV use and engine queues may be.
        self.tolerance_s = self.SCRAPE_S + profile.step_s(profile.max_num_seqs, profile.max_num_batched_tokens)
        self.flow = FlowController(lambda: flow, self._room, self.time.clock, timer=self.time.call_later)
        self.reserves = reserves
        self.outcome = Outcome()
        self._waiting: list[tuple[Ticket, GenRequest]] = []
        self._free_since: dict[Ticket, float] = {}  # held tickets some engine could take, since when
        for i, node in enumerate(self.nodes):  # staggered scrapes, as independent scrape tasks would be
            self.time.call_later(self.SCRAPE_S * (i + 1) / engines, lambda n=node: self._scrape(n))

    # -- the gateway's side ----------------------------------------------------------------------------

    def _room(self, pool: str, now: float, reserve: float, enough: float) -> Room:
        return Room.of((self.load.room(node.endpoint, now, reserve) for node in self.nodes), enough)

    def offer(self, request: GenRequest, klass: str) -> None:
        verdict = self.flow.offer("pool", "tenant", klass, len(request.prompt_ids) + len(request.output_ids))
        if verdict == GO:
            self._route(request)
        elif isinstance(verdict, Rejected):
            self.outcome.refused.append(verdict)
        else:
            assert isinstance(verdict, Ticket)
            self.outcome.held += 1
            self._waiting.append((verdict, request))

    def _route(self, request: GenRequest) -> None:
        now = self.time.now
        with_room = [n for n in self.nodes if (r := self.load.room(n.endpoint, now)) is None or r > 0]
        node = min(with_room or self.nodes, key=lambda n: self.load.requests(n.endpoint, now))
        node.endpoint.in_flight += 1

        def progress(done: GenRequest, node: Node = node) -> None:
            if done.state is RequestState.FINISHED:
                node.endpoint.in_flight -= 1  # the stream ended: the lease goes back
                self.outcome.served += 1
                self.flow.finished("pool")

        request.on_progress = progress
        request.notify_every = 0
        node.engine.submit(request)
        if not node.stepping:
            self._begin(node)

    def _settle_tickets(self) -> None:
        still: list[tuple[Ticket, GenRequest]] = []
        for ticket, request in self._waiting:
            if not ticket.settled:
                still.append((ticket, request))
            elif ticket.granted:
                self._route(request)
                self.flow.routed(ticket)
            else:
                outcome = ticket.outcome
                assert outcome is not None
                self.outcome.refused.append(outcome)
        self._waiting = still

    # -- the engines' side -----------------------------------------------------------------------------

    def _begin(self, node: Node) -> None:
        step = node.engine.begin_step(self.time.now)
        node.stepping = step is not None
        if step is not None:
            self.time.call_later(step.duration_s, lambda: self._end(node, step))

    def _end(self, node: Node, step: Step) -> None:
        node.engine.end_step(step, self.time.now)
        self._begin(node)

    def _scrape(self, node: Node) -> None:
        engine = node.engine
        gauges = engine.gauges(self.time.now)
        steps = engine.counters.histograms["vllm:iteration_tokens_total"]
        metrics = EndpointMetrics(scraped_at=self.time.now, running=gauges.running, waiting=gauges.waiting,
                                  kv_usage=gauges.kv_usage, preemptions=engine.counters.preemptions,
                                  step_tokens_buckets=tuple((float(b), float(c)) for b, c in steps.cumulative()))
        node.endpoint.scraped(metrics, node.endpoint.in_flight, self.saturation)
        self.flow.kick_all()
        self.time.call_later(self.SCRAPE_S, lambda: self._scrape(node))

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
        for ticket, request in self._waiting:
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
