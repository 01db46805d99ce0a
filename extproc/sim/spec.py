"""What one simulated replica is: a served model on an address with a profile and faults."""

from __future__ import annotations

from dataclasses import dataclass, field

from extproc.sim.faults import FaultSettings
from extproc.sim.profile import Profile

__all__ = ["ReplicaSpec"]


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One replica; `port=0` picks a free port (read it back from `Replica.port` after start).

    `stream_chunk_tokens` trades stream granularity for CPU: a stream wakes up once per N generated tokens
    and sends them in one SSE chunk (the first token is always sent alone at TTFT).
    """

    model: str
    host: str
    port: int
    profile: Profile
    lora_adapters: tuple[str, ...] = ()
    stream_chunk_tokens: int = 1
    seed: int = 0
    faults: FaultSettings = field(default_factory=FaultSettings)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} out of range")
        if self.stream_chunk_tokens < 1:
            raise ValueError("stream_chunk_tokens must be >= 1")
        if self.model in self.lora_adapters:
            raise ValueError("a LoRA adapter cannot share the served model's name")
        if len(set(self.lora_adapters)) != len(self.lora_adapters):
            raise ValueError("duplicate LoRA adapter names")
