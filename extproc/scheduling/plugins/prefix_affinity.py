"""prefix-affinity-scorer: send requests that share a prompt prefix to the endpoint caching it.

Two signals, highest wins:
- Deterministic placement, identical in every gateway replica with no shared memory: the prefix's
  anchor (hash of its first `anchor_blocks` blocks) ranks endpoints by rendezvous hashing; the home
  is the best-ranked endpoint whose load is within `load_bound` x the pool average (consistent
  hashing with bounded loads), so a hot prefix spills to its next-ranked endpoint, not anywhere.
- A learned index of where this process sent each block chain recently (bounded LRU), which knows
  deeper matches (multi-turn histories) the anchor cannot tell apart.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.prefix import rendezvous
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "prefix-affinity-scorer"


@dataclass(frozen=True)
class Params:
    anchor_blocks: int = 8  # ~128 tokens identify a shared prefix (system prompt, conversation start)
    load_bound: float = 1.25  # home may carry at most this x the average load (+1)
    spill_score: float = 0.5  # score of the next-ranked endpoint (where this prefix spills)
    index_capacity: int = 200_000  # block hashes remembered (LRU)
    min_blocks: int = 1  # prompts shorter than this many blocks get no affinity

    def __post_init__(self) -> None:
        if self.anchor_blocks < 1 or self.index_capacity < 1 or self.load_bound < 1.0:
            raise ValueError("anchor_blocks and index_capacity must be >= 1, load_bound >= 1.0")


class PrefixAffinityScorer:
    needs_prefix = True

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self._index: OrderedDict[int, str] = OrderedDict()  # block hash -> endpoint address

    def ranking(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[int]:
        """Endpoint indexes in rendezvous order for this request's anchor."""
        blocks = request.prefix_blocks
        anchor = blocks[min(len(blocks), self.params.anchor_blocks) - 1]
        return sorted(range(len(endpoints)), key=lambda i: rendezvous(anchor, endpoints[i].address), reverse=True)

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        blocks = request.prefix_blocks
        scores = [0.0] * len(endpoints)
        if len(blocks) < self.params.min_blocks or not blocks:
            return scores
        loads = [request.load.requests(e, request.now) for e in endpoints]
        bound = self.params.load_bound * (sum(loads) / len(loads) + 1.0)
        eligible = [i for i in self.ranking(request, endpoints) if loads[i] <= bound]
        if eligible:
            scores[eligible[0]] = 1.0
            if len(eligible) > 1:
                scores[eligible[1]] = self.params.spill_score
        learned = self._learned(blocks, endpoints)
        return [max(s, learned.get(e.address, 0.0)) for s, e in zip(scores, endpoints, strict=True)]

    def _learned(self, blocks: tuple[int, ...], endpoints: Sequence[Endpoint]) -> dict[str, float]:
        """Fraction of the prompt's blocks each endpoint was last sent (longest chain match, deepest first)."""
        present = {e.address for e in endpoints}
        found: dict[str, float] = {}
        total = len(blocks)
        # Probe a few depths from the deepest down: chained hashes mean a match at depth d implies d-1.
        depth = total
        while depth > 0 and len(found) < len(present):
            address = self._index.get(blocks[depth - 1])
            if address is not None and address in present and address not in found:
                found[address] = depth / total
            depth = depth - 1 if depth <= 16 else depth - max(1, depth // 8)
        return found

    def observe(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        index = self._index
        for block in request.prefix_blocks:
            index[block] = endpoint.address
            index.move_to_end(block)
        while len(index) > self.params.index_capacity:
            index.popitem(last=False)


def create(name: str, parameters: Mapping[str, Any]) -> PrefixAffinityScorer:
    return PrefixAffinityScorer(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
