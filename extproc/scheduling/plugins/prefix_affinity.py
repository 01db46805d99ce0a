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

import heapq
from collections import OrderedDict
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.prefix import rendezvous
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "prefix-affinity-scorer"
NOMINEES = 4  # ranked endpoints a request's anchor nominates when a large pool is scheduled over a sample
RANKS_KEPT = 4096  # anchors whose ranking is remembered per endpoint set (LRU)
POOLS_KEPT = 16  # endpoint sets (pools, versions) with remembered rankings


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
        # id(endpoint set) -> (that set, its endpoints by address, anchor -> top NOMINEES of the set)
        self._ranks: OrderedDict[int, tuple[Sequence[Endpoint], dict[str, Endpoint],
                                            OrderedDict[int, list[Endpoint]]]] = OrderedDict()

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
        learned = self._learned(blocks, {e.address for e in endpoints}, len(endpoints))
        return [max(s, learned.get(e.address, 0.0)) for s, e in zip(scores, endpoints, strict=True)]

    def nominate(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        """The anchor's best-ranked endpoints of the whole set and those that served deeper matches, so that a
        sample of a large pool still holds the prefix's home (rankings remembered per anchor: not rehashed
        over every endpoint per request)."""
        blocks = request.prefix_blocks
        if len(blocks) < self.params.min_blocks or not blocks:
            return []
        known = self._ranks.get(id(endpoints))
        if known is None or known[0] is not endpoints:
            known = (endpoints, {e.address: e for e in endpoints}, OrderedDict())
            self._ranks[id(endpoints)] = known
            while len(self._ranks) > POOLS_KEPT:
                self._ranks.popitem(last=False)
        self._ranks.move_to_end(id(endpoints))
        _, by_address, ranked = known
        anchor = blocks[min(len(blocks), self.params.anchor_blocks) - 1]
        top = ranked.get(anchor)
        if top is None:
            top = ranked[anchor] = heapq.nlargest(NOMINEES, endpoints, key=lambda e: rendezvous(anchor, e.address))
            if len(ranked) > RANKS_KEPT:
                ranked.popitem(last=False)
        else:
            ranked.move_to_end(anchor)
        learned = self._learned(blocks, by_address, len(by_address))
        return [*top, *(by_address[address] for address in learned)]

    def _learned(self, blocks: tuple[int, ...], present: Container[str], size: int) -> dict[str, float]:
        """Fraction of the prompt's blocks each endpoint of `present` (`size` of them) was last sent (longest
        chain match, deepest first)."""
        found: dict[str, float] = {}
        total = len(blocks)
        # Probe a few depths from the deepest down: chained hashes mean a match at depth d implies d-1.
        depth = total
        while depth > 0 and len(found) < size:
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
