"""Builders shared by the scheduling tests."""

from __future__ import annotations

from extproc.config.schema import SaturationConfig
from extproc.endpoints import Endpoint, EndpointMetrics
from extproc.endpoints.load import LoadModel
from extproc.scheduling import SchedulingRequest, prefix_blocks

NOW = 100.0


def endpoint(address: str, *, running: float = 0, waiting: float = 0, kv: float = 0.0, in_flight: int = 0,
             age: float = 0.0, loras: frozenset[str] = frozenset(), max_lora: int = 4,
             scraped: bool = True) -> Endpoint:
    metrics = EndpointMetrics(scraped_at=NOW - age, running=running, waiting=waiting, kv_usage=kv,
                              running_loras=loras, max_lora=max_lora) if scraped else None
    return Endpoint(address, in_flight=in_flight, metrics=metrics)


def fleet(count: int = 8) -> list[Endpoint]:
    return [endpoint(f"10.0.0.{i + 1}:8000") for i in range(count)]


def request(prompt: str = "", *, lora: str | None = None, session: str | None = None,
            replicas: int = 1, sequence: int = 0, seats: int | None = None, now: float = NOW,
            pool: tuple[Endpoint, ...] = ()) -> SchedulingRequest:
    load = LoadModel(SaturationConfig(), stale_after_s=1.0, seats=seats, replicas=replicas)
    return SchedulingRequest(model="m", prompt_tokens=len(prompt) // 4, max_output_tokens=64,
                             prefix_blocks=prefix_blocks(prompt), lora=lora, session=session, now=now,
                             load=load, sequence=sequence, pool=pool)
