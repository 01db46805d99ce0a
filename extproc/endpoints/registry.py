"""Live per-endpoint state: this process's in-flight work, the last vLLM scrape, what the scrapes taught.

`Endpoint` is the one owner of that state: every change goes through one of its methods (a lease taken or
released, a scrape adopted or failed, the other replicas' in-flight counts, a served request's latency).
The registry interns endpoints by address, so an endpoint kept across a policy reload or a DNS change keeps
its state (its leases still balance); an address no pool names any more is forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from extproc.endpoints.config import SaturationConfig
from extproc.endpoints.engine import EngineState, learn
from extproc.endpoints.metrics import EndpointMetrics

__all__ = ["Endpoint", "EndpointRegistry", "Lease"]

_LATENCY_EWMA_ALPHA = 0.2


@dataclass(slots=True, eq=False)
class Endpoint:
    address: str
    in_flight: int = 0
    in_flight_tokens: int = 0  # estimated prompt + expected output tokens of this process's requests
    picked_total: int = 0
    metrics: EndpointMetrics | None = None  # None until the first successful scrape
    scrape_failures: int = 0  # consecutive failed scrapes
    latency_ewma_s: float | None = None  # time from routing to response headers
    # The replicas' in-flight requests here when `metrics` was fetched (`fleet_in_flight` then: this process's plus
    # the others' as last synced), so that what the replicas sent and what ended since is the change of it.
    in_flight_at_scrape: int = 0
    others_in_flight: int = 0  # other service replicas' in-flight requests here (extproc.server.fleet)
    engine: EngineState = field(default_factory=EngineState)
    asleep: bool = False  # vLLM sleep mode: asleep, going to sleep or waking (extproc.endpoints.sleep)
    adapters: frozenset[str] = frozenset()  # LoRA adapters loaded, as last seen (extproc.endpoints.adapters)

    @property
    def fleet_in_flight(self) -> int:
        """The service replicas' in-flight requests here: this process's plus the others' as last synced (without
        the fleet sync, this process's alone)."""
        return self.in_flight + self.others_in_flight

    def lease(self, tokens: int = 0) -> Lease:
        """A request routed here: counted in flight until the lease is released."""
        self.in_flight += 1
        self.in_flight_tokens += tokens
        self.picked_total += 1
        return Lease(self, tokens)

    def _returned(self, tokens: int) -> None:
        self.in_flight -= 1
        self.in_flight_tokens -= tokens

    def scraped(self, metrics: EndpointMetrics, in_flight: int, config: SaturationConfig) -> None:
        """A good scrape, started while the replicas had `in_flight` requests here (`fleet_in_flight` then)."""
        self.metrics = metrics
        self.in_flight_at_scrape = in_flight
        self.scrape_failures = 0
        learn(self.engine, metrics, config)

    def scrape_failed(self) -> None:
        self.scrape_failures += 1

    def others(self, in_flight: int) -> None:
        """The other service replicas' in-flight requests here, as last synced."""
        self.others_in_flight = in_flight

    def served(self, latency_s: float) -> None:
        """A request served here got its response headers `latency_s` after it was routed."""
        previous = self.latency_ewma_s
        self.latency_ewma_s = latency_s if previous is None else previous + _LATENCY_EWMA_ALPHA * (latency_s - previous)


class Lease:
    """One request's claim on an endpoint (`Endpoint.lease`); releasing it twice is harmless."""

    __slots__ = ("_released", "endpoint", "tokens")

    def __init__(self, endpoint: Endpoint, tokens: int) -> None:
        self.endpoint = endpoint
        self.tokens = tokens
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.endpoint._returned(self.tokens)


class EndpointRegistry:
    """Endpoints by address: the set the current pools name."""

    def __init__(self) -> None:
        self._by_address: dict[str, Endpoint] = {}

    def adopt(self, pools: Iterable[tuple[str, Iterable[str]]]) -> dict[str, tuple[Endpoint, ...]]:
        """The endpoints of `(pool name, addresses)`: known addresses keep their endpoint (and its state),
        new ones get a fresh one, and addresses no pool names any more are forgotten."""
        known = self._by_address
        fresh: dict[str, Endpoint] = {}
        found: dict[str, tuple[Endpoint, ...]] = {}
        for name, addresses in pools:
            endpoints = []
            for address in addresses:
                endpoint = fresh.get(address) or known.get(address) or Endpoint(address)
                fresh[address] = endpoint
                endpoints.append(endpoint)
            found[name] = tuple(endpoints)
        self._by_address = fresh
        return found

    def endpoints(self) -> list[Endpoint]:
        """Every distinct endpoint (an address in two pools is one endpoint)."""
        return list(self._by_address.values())

    def find(self, address: str) -> Endpoint | None:
        return self._by_address.get(address)

    def snapshot(self) -> Mapping[str, Endpoint]:
        return dict(self._by_address)
