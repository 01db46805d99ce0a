"""Stage 5, scheduling: which endpoints of the pool serve the request, and what Envoy must be told.

Candidates are the pool's usable endpoints (circuit breakers, scrape health), narrowed to those with room for
the request's priority class; a pool without a usable endpoint hands over to its backup pool. The pool's
scheduling profile picks the primary and its fallbacks. The route sets the pool (cluster) header and the
destination endpoints, and rewrites the body when the engine must see something else (an alias's served name,
`stream_options.include_usage` for usage accounting, a masked or capped request).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from extproc.config.epp import DESTINATION_ENDPOINT
from extproc.endpoints import Endpoint
from extproc.endpoints.health import HealthTracker
from extproc.gateway.records import Admitted, Caller, Resolved, Routed, route_metadata
from extproc.gateway.runtime import Pool
from extproc.gateway.stateful import new_response_id, pinned_endpoint
from extproc.gateway.types import Route
from extproc.openai import Api, rewrite_body
from extproc.openai import errors as oai
from extproc.openai.prompt import MESSAGE_START
from extproc.scheduling import Explanation, SchedulingRequest
from extproc.scheduling.prefix import PrefixChains
from extproc.telemetry import GatewayMetrics

__all__ = ["Schedule", "in_subset"]


def in_subset(endpoints: Iterable[Endpoint], subset: tuple[str, ...]) -> list[Endpoint]:
    """The endpoints a subset hint allows: entries are `ip:port`, or a bare IP allowing every port of it."""
    allowed = set(subset)
    return [e for e in endpoints if e.address in allowed or e.address.rpartition(":")[0].strip("[]") in allowed]


TIMED_EVERY = 16  # one decision in this many times its plugins (extproc_scheduler_plugin_seconds): a sample


class Schedule:
    def __init__(self, health: HealthTracker, metrics: GatewayMetrics, clock: Callable[[], float]) -> None:
        self.health = health
        self._metrics = metrics
        self._clock = clock
        self._sequence = 0  # per-process request counter: pickers break ties with it
        self._timers: dict[str, Callable[[float], None]] = {}
        self._chains = PrefixChains(MESSAGE_START)  # prompts' block hashes, their shared leading messages hashed once

    def _time(self, plugin: str, seconds: float) -> None:
        observe = self._timers.get(plugin)
        if observe is None:
            observe = self._timers[plugin] = self._metrics.plugin_seconds.labels(plugin).observe
        observe(seconds)

    def usable(self, pool: Pool, now: float) -> list[Endpoint]:
        return pool.ready(self.health.usable(pool.endpoints, now))

    def _candidates(self, caller: Caller, pool: Pool, scheduling: SchedulingRequest) -> list[Endpoint]:
        """The usable endpoints (of the subset hint, when the gateway sent one) with room for the caller's class
        (all usable ones when none has room). A pool larger than `scheduling.max_candidates` is first tried over a
        sample (`Profile.narrow`): its usable endpoints with room, or, when it has none, the whole pool."""
        runtime, now = caller.runtime, scheduling.now
        endpoints = pool.endpoints
        subset = caller.head.subset
        if subset is not None:  # endpoint-picker protocol: only from the gateway's hint
            endpoints = tuple(in_subset(endpoints, subset))
        load = pool.load
        reserve = runtime.policy.flow_control.classes[caller.klass].reserve if caller.klass else 0.0
        limit = runtime.policy.scheduling.max_candidates
        if limit and len(endpoints) > limit:
            chooser = random.Random(scheduling.sequence)  # reproducible per request, like the picker's ties
            sample = runtime.scheduler.profile(pool.config.profile).narrow(scheduling, endpoints, limit, chooser)
            with_room = [e for e in pool.ready(self.health.usable(sample, now))
                         if (room := load.room(e, now, reserve)) is None or room > 0]
            if with_room:
                return with_room
        candidates = pool.ready(self.health.usable(endpoints, now))
        if caller.klass and len(candidates) > 1:
            with_room = [e for e in candidates if (room := load.room(e, now, reserve)) is None or room > 0]
            candidates = with_room or candidates
        return candidates

    def request(self, caller: Caller, resolved: Resolved, pool: Pool, sequence: int = 0) -> SchedulingRequest:
        """What the pool's scheduling profile is told about the request."""
        request = resolved.request
        config = pool.config
        profile = caller.runtime.scheduler.profile(config.profile)
        return SchedulingRequest(
            model=request.model,
            prompt_tokens=resolved.prompt_tokens,
            max_output_tokens=request.output_tokens,
            prefix_blocks=self._chains(request.prompt_text) if profile.needs_prefix else (),
            lora=request.model if request.model in config.lora_adapters else None,
            session=caller.head.headers.get("x-session-id") or request.user,
            now=self._clock(),
            load=pool.load,
            sequence=sequence,
        )

    def __call__(self, caller: Caller, resolved: Resolved, admitted: Admitted | None,
                 explain: Explanation | None = None, record: Explanation | None = None) -> Routed:
        """Pick and commit (leases, breaker probes, what plugins learn); raises 503 `no_capacity`. With `explain`
        the decision is only described: no lease, no learning, no counters. `record` (a traced exchange's) gets
        the scores of a decision that is committed as usual."""
        runtime = caller.runtime
        now = self._clock()
        pool = runtime.pools[resolved.pool.name]
        sequence = self._sequence + 1
        scheduling = self.request(caller, resolved, pool, sequence)
        candidates = self._candidates(caller, pool, scheduling)
        picker = runtime.policy.mode == "endpoint-picker"
        if caller.head.subset is not None and not candidates:  # the protocol: nothing in the hint is eligible
            raise oai.no_capacity(pool.name, subset=True)
        if resolved.request.model in pool.config.lora_paths:  # an adapter loaded on demand: where it is loaded
            candidates = [e for e in candidates if resolved.request.model in e.adapters] or candidates
        backup = pool.config.backup_pool
        if not candidates and backup is not None:  # no healthy endpoint: the backup pool serves
            standby = runtime.pools[backup]
            if found := self.usable(standby, now):
                pool, candidates = standby, found
                scheduling = self.request(caller, resolved, pool, sequence)
        config = pool.config
        fallbacks = 0 if picker and runtime.policy.endpoint_picker.single_endpoint else config.fallbacks
        timer = self._time if sequence % TIMED_EVERY == 0 else None
        picked = runtime.scheduler.schedule(config.profile, scheduling, candidates, 1 + fallbacks, timer,
                                            explain if explain is not None else record) if candidates else []
        if not picked:
            raise oai.no_capacity(config.name)
        request = resolved.request
        fields: dict[str, str] | None = None
        if request.api is Api.RESPONSES:  # stored responses live on the endpoint that served them
            if request.previous_response_id is not None:
                # Any usable endpoint of the pool (not only this decision's candidates, a sample in large pools).
                home = pinned_endpoint(request.previous_response_id, config.name, self.usable(pool, now))
                if home is not None:
                    picked = [home, *(e for e in picked if e is not home)][:1 + config.fallbacks]
            fields = {"request_id": new_response_id(config.name, picked[0].address,
                                                    picked[1].address if len(picked) > 1 else None)}
        rewrite = request.model != config.model and request.model not in config.lora_adapters
        # Usage of streamed responses only comes with include_usage; Envoy copies it into metadata (to settle a
        # reservation, and for the audit log).
        want_usage = request.stream and not request.include_usage and (
            admitted is not None or bool(runtime.policy.audit.path))
        new_body = rewrite_body(request.document, config.model if rewrite else None, want_usage, fields) if (
            rewrite or want_usage or resolved.body_changed or fields) else None
        addresses = tuple(e.address for e in picked)
        envoy = runtime.policy.envoy
        destination = ",".join(addresses)
        # Endpoint-picker mode: the gateway chose the pool; the pick goes in the protocol's header (and, by the
        # server adapter, in the same value under the envoy.lb metadata).
        headers = [(DESTINATION_ENDPOINT, destination)] if picker else [
            (envoy.cluster_header, config.cluster or config.name), (envoy.endpoint_header, destination)]
        if new_body is not None:
            headers.append(("content-length", str(len(new_body))))
        route = Route(config.name, addresses, tuple(headers), new_body,
                      route_metadata(caller, resolved, config.name, admitted))
        if explain is not None:
            return Routed(config.name, route, (), now)
        # Committed only once nothing else can fail.
        self._sequence = sequence
        self.health.picked(picked[0], now)
        runtime.scheduler.profile(config.profile).observe(scheduling, picked[0])
        default_output = runtime.policy.limits.default_output_tokens
        lease = picked[0].lease(scheduling.prompt_tokens + (scheduling.max_output_tokens or default_output))
        self._metrics.in_flight.inc()
        return Routed(config.name, route, (lease,), self._clock())
