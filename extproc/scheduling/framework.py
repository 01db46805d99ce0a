"""The scheduling framework: Filter, Scorer and Picker protocols, profiles and their evaluation.

Plugins see plain types only (no gRPC, no Envoy). The framework, not the plugins, clamps scores to
[0, 1], applies weights and times plugins (when asked: the gateway samples), so a plugin stays a small pure
function.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from extproc.endpoints import Endpoint
from extproc.endpoints.config import SaturationConfig
from extproc.endpoints.load import LoadModel

# Scheduling requests built without a pool's model (tests, benches): default saturation, 1 s staleness.
DEFAULT_LOAD = LoadModel(SaturationConfig(), stale_after_s=1.0)


@dataclass(frozen=True, slots=True)
class SchedulingRequest:
    """What scheduling knows about one request; built once per request by the gateway."""

    model: str
    prompt_tokens: int  # estimate
    max_output_tokens: int | None
    prefix_blocks: tuple[int, ...]  # chained block hashes of the prompt (empty if no plugin needs them)
    lora: str | None = None  # adapter name when the request targets a LoRA adapter
    session: str | None = None  # session key (header or body `user`) for session affinity
    now: float = 0.0  # monotonic clock, seconds
    # The pool's load model: the same load, room and saturation flow control uses.
    load: LoadModel = DEFAULT_LOAD
    # Per-process request counter: pickers break ties with it, so a decision is a pure function of
    # (request, endpoint state) and /debug/explain can reproduce the next one exactly.
    sequence: int = 0
    # The pool's whole endpoint set (before health, filters, the gateway's subset hint and sampling), the same
    # object until the pool's endpoints change: plugins that divide the pool between service replicas deal over
    # it, so a share does not depend on which candidates a request has. Empty when the caller names no pool
    # (then the candidates stand for it).
    pool: tuple[Endpoint, ...] = ()


@runtime_checkable
class Filter(Protocol):
    name: str

    def filter(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]: ...


@runtime_checkable
class Scorer(Protocol):
    name: str

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]: ...


@runtime_checkable
class Picker(Protocol):
    name: str

    def pick(self, request: SchedulingRequest, endpoints: Sequence[Endpoint], totals: Sequence[float],
             count: int) -> list[Endpoint]: ...


@runtime_checkable
class Observer(Protocol):
    """Optional: plugins that learn from where requests were sent (e.g. a prefix index)."""

    def observe(self, request: SchedulingRequest, endpoint: Endpoint) -> None: ...


@runtime_checkable
class SharedState(Protocol):
    """Optional: plugins whose learned state the other service replicas should learn too (e.g. where prefixes
    were placed), carried as text lines through Redis by `extproc.server.placements`."""

    name: str

    def export_shared(self, now: float) -> list[str]:
        """Lines learned since the last call that stay true (e.g. placements): kept and resent when an exchange
        fails; a replica that starts reads the recent ones."""
        ...

    def export_perishable(self, now: float) -> list[str]:
        """Lines since the last call whose meaning fades within a second (e.g. a request's prefill backlog): sent as
        soon as possible, never resent."""
        ...

    def watch(self, notify: Callable[[], None]) -> None:
        """Call `notify` whenever a perishable line is ready (on the event loop; it must not block)."""
        ...

    def import_shared(self, lines: Sequence[str], now: float, age_s: float = 0.0) -> int:
        """Learn lines another replica exported `age_s` ago (`now`, `age_s`: on the scheduling clock)."""
        ...

    def unshared_replicas(self, count: int) -> None:
        """`count` service replicas (this one included) decide alongside each other without sharing this state
        (1: alone, or shared): the plugin must then decide alike in every replica from what they all see."""

    def replica_slot(self, index: int, count: int) -> None:
        """This replica is `index` (0-based) of `count` live replicas that share this state (0 of 1: alone), as
        the replicas' in-flight exchange last heard: the same numbering in every replica, so that they can
        divide work (e.g. which endpoints each places new prefixes on first)."""


@runtime_checkable
class Nominator(Protocol):
    """Optional: plugins that name the endpoints a request must be scored on even when a large pool is
    scheduled over a sample (e.g. the endpoints caching its prefix)."""

    def nominate(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]: ...


@runtime_checkable
class NeedsPrefix(Protocol):
    needs_prefix: bool


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


@dataclass(slots=True)
class Explanation:
    """Every endpoint's per-scorer scores and total, for /debug/explain and tests."""

    filtered_out: list[str] = field(default_factory=list)
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)


PluginTimer = Callable[[str, float], None]


@dataclass(frozen=True)
class Profile:
    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker
    # Derived once here, not per request: protocol isinstance checks are slow.
    needs_prefix: bool = field(init=False)
    observers: tuple[Observer, ...] = field(init=False)
    nominators: tuple[Nominator, ...] = field(init=False)

    def __post_init__(self) -> None:
        plugins = (*self.filters, *(w.scorer for w in self.scorers), self.picker)
        object.__setattr__(self, "needs_prefix", any(isinstance(p, NeedsPrefix) and p.needs_prefix for p in plugins))
        object.__setattr__(self, "observers", tuple(p for p in plugins if isinstance(p, Observer)))
        object.__setattr__(self, "nominators", tuple(p for p in plugins if isinstance(p, Nominator)))

    def narrow(self, request: SchedulingRequest, endpoints: Sequence[Endpoint], limit: int,
               chooser: random.Random) -> Sequence[Endpoint]:
        """At most about `limit` endpoints to schedule a large pool over: every endpoint a plugin nominates,
        then a uniform sample of the rest (the best of a random `limit` is, like the power of two choices, close
        to the best of all). The whole pool when it is not larger than `limit`."""
        if len(endpoints) <= limit:
            return endpoints
        chosen: dict[int, Endpoint] = {}
        for nominator in self.nominators:
            for endpoint in nominator.nominate(request, endpoints):
                chosen[id(endpoint)] = endpoint
        for endpoint in chooser.sample(endpoints, max(0, limit - len(chosen))):
            chosen[id(endpoint)] = endpoint
        return list(chosen.values())

    def schedule(
        self, request: SchedulingRequest, endpoints: Sequence[Endpoint], count: int,
        timer: PluginTimer | None = None, explain: Explanation | None = None,
    ) -> list[Endpoint]:
        """Primary endpoint first, then up to `count - 1` fallbacks in preference order. `timer` (when given)
        is told each plugin's time; without it no clock is read."""
        candidates = list(endpoints)
        clock = time.perf_counter
        for plugin in self.filters:
            started = clock() if timer is not None else 0.0
            kept = plugin.filter(request, candidates)
            if timer is not None:
                timer(plugin.name, clock() - started)
            if explain is not None:
                kept_ids = {id(e) for e in kept}
                explain.filtered_out += [e.address for e in candidates if id(e) not in kept_ids]
            candidates = kept
        if not candidates:
            return []
        totals = [0.0] * len(candidates)
        for weighted in self.scorers:
            started = clock() if timer is not None else 0.0
            raw = weighted.scorer.score(request, candidates)
            if timer is not None:
                timer(weighted.scorer.name, clock() - started)
            weight = weighted.weight
            for index, value in enumerate(raw):
                # Into [0, 1], NaN -> 0, as a float (+ 0.0: -0.0 and ints too); not min/max, 8x slower.
                clamped = value + 0.0 if 0.0 <= value <= 1.0 else (1.0 if value > 1.0 else 0.0)
                totals[index] += weight * clamped
                if explain is not None:
                    explain.scores.setdefault(candidates[index].address, {})[weighted.scorer.name] = clamped
        if explain is not None:
            explain.totals = {e.address: t for e, t in zip(candidates, totals, strict=True)}
        started = clock() if timer is not None else 0.0
        chosen = self.picker.pick(request, candidates, totals, count)
        if timer is not None:
            timer(self.picker.name, clock() - started)
        return chosen

    def observe(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        for observer in self.observers:
            observer.observe(request, endpoint)
