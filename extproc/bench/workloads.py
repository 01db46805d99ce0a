"""Request mixes for the demo and benchmarks: deterministic for a seed, cheap to generate."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extproc.bench.loadgen import RequestSpec

_WORDS = ("gpu", "token", "cache", "prefix", "stream", "latency", "envoy", "router", "batch", "model",
          "tenant", "quota", "replica", "kernel", "memory", "queue", "policy", "canary", "weight", "shard")

JSON_HEADERS = (("content-type", "application/json"),)


def filler(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


@dataclass(frozen=True)
class ModelTarget:
    """A model the workload asks for; `names` are the names clients use (served name or aliases)."""

    pool: str
    names: tuple[str, ...]
    weight: float


def chat_spec(model: str, system: str, question: str, *, stream: bool, max_tokens: int,
              labels: dict[str, str], ignore_eos: bool = False) -> RequestSpec:
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if ignore_eos:  # vLLM's extension: generate exactly max_tokens
        body["ignore_eos"] = True
    if stream:
        body["stream_options"] = {"include_usage": True}
    return RequestSpec("POST", "/v1/chat/completions", JSON_HEADERS, json.dumps(body).encode(), stream,
                       {**labels, "api": "chat", "stream": str(stream).lower()})


def completion_spec(model: str, prompt: str, *, stream: bool, max_tokens: int,
                    labels: dict[str, str]) -> RequestSpec:
    body: dict[str, object] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return RequestSpec("POST", "/v1/completions", JSON_HEADERS, json.dumps(body).encode(), stream,
                       {**labels, "api": "completions", "stream": str(stream).lower()})


def demo_mix(targets: Sequence[ModelTarget], seed: int = 0, stream_share: float = 0.7,
             system_prompts: int = 4) -> Callable[[int], RequestSpec]:
    """Mixed chat/completions traffic, streaming and not, a few shared system prompts per model."""
    prompt_rng = random.Random(seed)
    systems = [f"You are assistant #{i}. " + filler(prompt_rng, 120) for i in range(system_prompts)]
    weights = [t.weight for t in targets]

    def next_spec(index: int) -> RequestSpec:
        rng = random.Random(seed * 1_000_003 + index)
        target = rng.choices(targets, weights)[0]
        model = rng.choice(target.names)
        stream = rng.random() < stream_share
        max_tokens = rng.randint(16, 160)
        labels = {"pool": target.pool, "model": model}
        if rng.random() < 0.8:
            return chat_spec(model, rng.choice(systems), filler(rng, rng.randint(5, 60)), stream=stream,
                             max_tokens=max_tokens, labels=labels)
        return completion_spec(model, filler(rng, rng.randint(20, 200)), stream=stream, max_tokens=max_tokens,
                               labels=labels)

    return next_spec
