"""The fleet's capacity for a routing workload, measured on the workload itself: what `--loads` are shares of.

Every workload gets the same definition. A sample of its requests is rendered and tokenized exactly as the
simulator does (chat template, tokenizer, 16-token chained block hashes keyed by LoRA adapter), in order,
against an unbounded cache that has seen every earlier request of the sample: a request's *cacheable* tokens
are its leading blocks some earlier request already had (what perfect routing with unlimited KV could reuse;
never the last token, as vLLM always computes it). The first `skip` requests only fill that cache. Then, per
pool, with the sample's means:

    capacity = replicas x Profile.capacity_rps(prompt, output, uncached = prompt - 0.8 x cacheable)

i.e. the engines' throughput when 80% of what could be cached is cached (`CAPACITY_HIT_SHARE`): a
cache-aware router holds about that at moderate load, and at higher load running requests crowd cached
prefixes out. With several pools the fleet's capacity is the rate at which the first pool fills up, given
each pool's share of the requests. Outputs are the requests' `max_tokens`, exact with `ignore_eos`, else the
simulator's mean stopping point.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extproc.bench.routing_workloads import RoutingWorkload
from extproc.sim.profile import Profile
from extproc.sim.tokens import Tokenizer, block_hashes, render_chat

__all__ = ["CAPACITY_HIT_SHARE", "PoolShape", "WorkloadCapacity", "measure_capacity"]

CAPACITY_HIT_SHARE = 0.8


@dataclass(frozen=True)
class PoolShape:
    """Mean tokens per request of one pool's share of the sample."""

    requests: int
    prompt_tokens: float
    cacheable_tokens: float
    output_tokens: float

    @property
    def uncached_tokens(self) -> float:
        return self.prompt_tokens - CAPACITY_HIT_SHARE * self.cacheable_tokens

    @property
    def ideal_hit_rate(self) -> float:
        return self.cacheable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class WorkloadCapacity:
    rps: float
    pools: Mapping[str, PoolShape]
    pool_rps: Mapping[str, float]  # each pool's own capacity (its replicas)
    sample: int
    skip: int

    def describe(self) -> dict[str, Any]:
        return {
            "rps": round(self.rps, 2),
            "rule": f"replicas x capacity_rps(prompt, output, prompt - {CAPACITY_HIT_SHARE:g} x cacheable) per pool, "
                    f"means over requests {self.skip}-{self.skip + self.sample - 1} of the workload (cacheable: "
                    "leading 16-token blocks an earlier request had); the fleet's rate at which the first pool "
                    "fills, given each pool's share",
            "pools": {name: {"share": round(shape.requests / self.sample, 3),
                             "prompt_tokens": round(shape.prompt_tokens, 1),
                             "cacheable_tokens": round(shape.cacheable_tokens, 1),
                             "ideal_hit_rate": round(shape.ideal_hit_rate, 4),
                             "output_tokens": round(shape.output_tokens, 1),
                             "capacity_rps": round(self.pool_rps[name], 2)}
                      for name, shape in self.pools.items()},
        }


def measure_capacity(workload: RoutingWorkload, profile: Profile, replicas: Mapping[str, int], *,
                     sample: int = 1500, skip: int = 500) -> WorkloadCapacity:
    tokenizer = Tokenizer(profile.vocab_size)
    block = profile.block_size
    seen: set[int] = set()
    sums: dict[str, list[float]] = {}
    for index in range(skip + sample):
        spec = workload.next_spec(index)
        body = json.loads(spec.body)
        ids = tokenizer.encode(render_chat(body["messages"]))
        salt = spec.labels.get("lora", "-")
        hashes = block_hashes(ids, block, "" if salt == "-" else salt)
        usable = min(len(hashes), (len(ids) - 1) // block)
        cached = 0
        while cached < usable and hashes[cached] in seen:
            cached += 1
        seen.update(hashes)
        if index < skip:
            continue
        max_tokens = int(body.get("max_tokens", profile.default_max_tokens))
        output = max_tokens if body.get("ignore_eos") else max_tokens * (1 + profile.min_output_fraction) / 2
        totals = sums.setdefault(spec.labels.get("pool", "-"), [0.0, 0.0, 0.0, 0.0])
        totals[0] += 1
        totals[1] += len(ids)
        totals[2] += cached * block
        totals[3] += output
    pools = {name: PoolShape(int(t[0]), t[1] / t[0], t[2] / t[0], t[3] / t[0]) for name, t in sums.items()}
    pool_rps = {name: replicas[name] * profile.capacity_rps(round(shape.prompt_tokens), shape.output_tokens,
                                                            round(shape.uncached_tokens))
                for name, shape in pools.items()}
    fleet = min(pool_rps[name] * sample / shape.requests for name, shape in pools.items())
    return WorkloadCapacity(fleet, pools, pool_rps, sample, skip)
