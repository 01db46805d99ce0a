"""An approximation of sglang-router's `cache_aware` policy for the virtual-time harness, so that our placement and
a peer's can be compared engine-side under identical conditions (same engines, arrivals and scrapes): per worker a
set of the 64-character block hashes of every prompt sent there (its "tree"); the load is the router's own count
of requests in flight. Defaults of `smg launch`: cache_threshold 0.3, balance_abs_threshold 64,
balance_rel_threshold 1.5. Imbalanced (max - min > 64 and max > 1.5 x min): the least loaded worker. Otherwise the
worker matching the longest prefix when it matches more than 0.3 of the prompt, else the one with the smallest
tree. An approximation (block granularity, no eviction within a 25 s run), not the router's code.
"""

from __future__ import annotations

from collections.abc import Sequence

from extproc.endpoints import Endpoint
from extproc.scheduling import SchedulingRequest

BLOCK_CHARS = 64


class SglangLike:
    def __init__(self) -> None:
        self.trees: dict[str, set[int]] = {}

    def schedule(self, _profile: str, request: SchedulingRequest, endpoints: Sequence[Endpoint],
                 _count: int) -> list[Endpoint]:
        loads = [e.in_flight for e in endpoints]
        if max(loads) - min(loads) > 64 and max(loads) > 1.5 * min(loads):
            return [endpoints[loads.index(min(loads))]]
        blocks = request.prefix_blocks
        matched = []
        for e in endpoints:
            tree = self.trees.get(e.address, set())
            depth = 0
            for position in range(len(blocks) - 1, -1, -1):
                if blocks[position] in tree:
                    depth = position + 1
                    break
            matched.append(depth)
        best = max(range(len(endpoints)), key=lambda i: matched[i])
        if matched[best] * BLOCK_CHARS > 0.3 * request.prompt_tokens * 4:
            return [endpoints[best]]
        sizes = [len(self.trees.get(e.address, ())) for e in endpoints]
        return [endpoints[sizes.index(min(sizes))]]

    def profile(self, _name: str) -> SglangLike:
        return self

    def observe(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        self.trees.setdefault(endpoint.address, set()).update(request.prefix_blocks)
