"""Live per-endpoint state of every pool: this process's in-flight work and the last vLLM scrape.

Config says which endpoints exist; this registry keeps the state that outlives a config reload (an
endpoint kept across a reload keeps its counters and metrics, so leases still balance).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """One scrape of a vLLM server's /metrics (names as vLLM exports them)."""

    scraped_at: float  # monotonic clock of the scraping process
    running: float = 0.0  # vllm:num_requests_running
    waiting: float = 0.0  # vllm:num_requests_waiting
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    running_loras: frozenset[str] = frozenset()  # vllm:lora_requests_info{running_lora_adapters}
    waiting_loras: frozenset[str] = frozenset()  # vllm:lora_requests_info{waiting_lora_adapters}
    max_lora: int = 0  # vllm:lora_requests_info{max_lora}
    prefix_queries: float = 0.0  # vllm:prefix_cache_queries_total (tokens)
    prefix_hits: float = 0.0  # vllm:prefix_cache_hits_total (tokens)
    block_size: int = 16  # vllm:cache_config_info{block_size}
    num_gpu_blocks: int = 0  # vllm:cache_config_info{num_gpu_blocks}
    # vllm:time_to_first_token_seconds histogram: (upper bound, cumulative count), sum, count.
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    preemptions: float = 0.0  # vllm:num_preemptions_total
    # vllm:iteration_tokens_total histogram (tokens per engine step): (upper bound, cumulative count).
    step_tokens_buckets: tuple[tuple[float, float], ...] = ()


@dataclass(slots=True)
class EngineState:
    """What the scrapes taught about an engine's limits; written only by `extproc.endpoints.load.observe`."""

    peak_running: float = 0.0  # the most requests ever seen running at once
    queued_since: float | None = None  # first scrape of the current run of scrapes with requests waiting
    queued_scrapes: int = 0
    queued_low: float = 0.0  # fewest / most running during that run
    queued_high: float = 0.0
    queued_kv: float = 0.0  # highest KV use during that run
    queued_steps: tuple[float, float] | None = None  # (steps, heavy steps) counted when that run began
    step_bound: float = 0.0  # upper bound of the histogram bucket of the largest step ever seen
    capacity: float = 0.0  # learned concurrency at which it queues (0: not learned)
    confirmed_at: float = 0.0  # scrape time the capacity was last learned or confirmed


@dataclass(slots=True, eq=False)
class Endpoint:
    address: str
    in_flight: int = 0
    in_flight_tokens: int = 0  # estimated prompt + expected output tokens of this process's requests
    picked_total: int = 0
    metrics: EndpointMetrics | None = None  # None until the first successful scrape
    scrape_failures: int = 0  # consecutive failed scrapes
    latency_ewma_s: float | None = None  # time from routing to response headers
    in_flight_at_scrape: int = 0  # in_flight when `metrics` was fetched (the since-scrape delta)
    others_in_flight: int = 0  # other service replicas' in-flight requests here (extproc.server.fleet)
    engine: EngineState = field(default_factory=EngineState)


@dataclass(slots=True)
class PoolState:
    name: str
    endpoints: list[Endpoint] = field(default_factory=list)


class Lease:
    """One request's claim on an endpoint; releasing it twice is harmless."""

    __slots__ = ("_released", "endpoint", "tokens")

    def __init__(self, endpoint: Endpoint, tokens: int = 0) -> None:
        self.endpoint = endpoint
        self.tokens = tokens
        self._released = False
        endpoint.in_flight += 1
        endpoint.in_flight_tokens += tokens
        endpoint.picked_total += 1

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.endpoint.in_flight -= 1
            self.endpoint.in_flight_tokens -= self.tokens


class EndpointRegistry:
    def __init__(self) -> None:
        self._pools: dict[str, PoolState] = {}

    def sync(self, pools: Iterable[tuple[str, Iterable[str]]]) -> None:
        """Make the registry match `(pool name, endpoint addresses)`, keeping known endpoints' state."""
        known = {ep.address: ep for state in self._pools.values() for ep in state.endpoints}
        fresh: dict[str, PoolState] = {}
        for name, addresses in pools:
            fresh[name] = PoolState(name, [known.setdefault(a, Endpoint(a)) for a in addresses])
        self._pools = fresh

    def pool(self, name: str) -> PoolState | None:
        return self._pools.get(name)

    def pools(self) -> list[PoolState]:
        return list(self._pools.values())

    def endpoints(self) -> list[Endpoint]:
        """Every distinct endpoint (an address in two pools is one endpoint)."""
        unique: dict[str, Endpoint] = {}
        for state in self._pools.values():
            for endpoint in state.endpoints:
                unique.setdefault(endpoint.address, endpoint)
        return list(unique.values())

    def total_in_flight(self) -> int:
        return sum(ep.in_flight for ep in self.endpoints())
