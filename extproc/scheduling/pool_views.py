"""What `prefix-affinity-scorer` remembers per endpoint set (a pool's, or a gateway's subset of it) while the set
lasts: its endpoints by address, their places in address order (how the pool is dealt between service replicas),
and the best-ranked endpoints per prompt anchor (what a request nominates when a large pool is scheduled over a
sample), so that those are not rebuilt or rehashed over every endpoint per request."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.endpoints import Endpoint
from extproc.scheduling.prefix import rendezvous

__all__ = ["NOMINEES", "POOLS_KEPT", "RANKS_KEPT", "PoolView", "PoolViews"]

NOMINEES = 4  # ranked endpoints a request's anchor nominates when a large pool is scheduled over a sample
RANKS_KEPT = 4096  # anchors whose ranking is remembered per endpoint set (LRU)
POOLS_KEPT = 16  # endpoint sets (pools, versions) with remembered rankings and deals


@dataclass(frozen=True, slots=True)
class PoolView:
    endpoints: Sequence[Endpoint]  # held, so that its id is not reused while remembered
    by_address: dict[str, Endpoint]
    position: dict[str, int]  # address -> place in address order: the deal between replicas
    ranked: OrderedDict[int, list[Endpoint]]  # anchor -> its top NOMINEES of the set (LRU)

    def nominees(self, anchor: int) -> list[Endpoint]:
        """The set's NOMINEES best-ranked endpoints for `anchor` (rendezvous), remembered."""
        top = self.ranked.get(anchor)
        if top is None:
            top = self.ranked[anchor] = heapq.nlargest(NOMINEES, self.endpoints,
                                                       key=lambda e: rendezvous(anchor, e.address))
            if len(self.ranked) > RANKS_KEPT:
                self.ranked.popitem(last=False)
        else:
            self.ranked.move_to_end(anchor)
        return top


class PoolViews:
    __slots__ = ("_views",)

    def __init__(self) -> None:
        self._views: OrderedDict[int, PoolView] = OrderedDict()  # id(endpoint set) -> its view (LRU)

    def __call__(self, endpoints: Sequence[Endpoint]) -> PoolView:
        """The remembered view of this endpoint set (built on its first use: once per pool version)."""
        view = self._views.get(id(endpoints))
        if view is None or view.endpoints is not endpoints:
            ordered = sorted({e.address for e in endpoints})
            view = PoolView(endpoints, {e.address: e for e in endpoints}, {a: n for n, a in enumerate(ordered)},
                            OrderedDict())
            self._views[id(endpoints)] = view
            while len(self._views) > POOLS_KEPT:
                self._views.popitem(last=False)
        self._views.move_to_end(id(endpoints))
        return view

    def dealt(self, pool: Sequence[Endpoint], addresses: Sequence[str], index: int, replicas: int) -> list[bool]:
        """Per address, whether it is dealt to replica `index` of `replicas`: the pool's endpoints in address order,
        one each to the replicas in turn (the addresses themselves when no pool is named)."""
        position = self(pool).position if pool else {a: n for n, a in enumerate(sorted(addresses))}
        return [(n := position.get(a)) is not None and n % replicas == index for a in addresses]
