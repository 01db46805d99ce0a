"""prefix-affinity-scorer: send requests that share a prompt prefix to an endpoint caching it, without piling a
hot prefix onto one endpoint.

Placement, in order:
1. Follow: the endpoints the request's deepest known prefix was sent to (its homes, from the prefix directory)
   that are not hot, or not for `hot_hold_ms` yet (a burst an engine clears in a few steps costs less than a
   full prefill of the prefix elsewhere: virtual time, issue 15's uniform workload at 80%, 4 seeds: 0-7 prefixes
   moved and TTFT p99 74-104 ms at once, 0-1 and 77-93 ms with 300 ms); the least loaded of them.
2. Otherwise place: a new prefix, or one whose homes are all hot, goes to an endpoint that is not hot, the one
   holding the deepest shorter prefix first (a conversation whose own endpoint is hot moves to another that
   has its system prompt), then the one with the least prefill backlog (uncached prompt tokens recently sent
   there, decaying), then the least loaded, then by rendezvous rank of the prompt's anchor (its first
   `anchor_blocks` blocks). The next endpoint in the same order is the spill (score `spill_score`).
   Service replicas that do not share their directories (several replicas, no Redis) must place a prefix alike
   without talking, whenever each first sees it: they skip backlog and load and take the best rendezvous rank
   among the endpoints that are not hot (consistent hashing with bounded loads). Balanced placement is worth
   it only with one view of the fleet's placements; without it, replicas placing by load would give a prefix
   a home each (measured in virtual time, 3 replicas, 48 prefixes of 3,000 tokens at 80% load: hit rate 0.75
   and TTFT p99 723 ms when placing by load, 0.90 and 115 ms by rank).
An endpoint is hot when its load (the pool's load model: scraped running + waiting plus what was sent since)
exceeds `load_bound` x the pool's average + `load_slack`. A hot prefix thus gains homes as its traffic needs
them and spreads over them; a cold one keeps one and is never moved by the small load differences a fixed
share of the average would react to (moving a prefix costs a full prefill of it elsewhere).

A pool larger than `scheduling.max_candidates` is scheduled over a sample: `nominate` adds the homes of the
request's known prefixes and the anchor's best-ranked endpoints of the whole pool, so the sample holds them.

The directory is learned from where requests were sent (`observe`). Service replicas share it through Redis
(`extproc.server.placements`): `export_shared` / `import_shared` carry what one replica placed to the others.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.prefix import rendezvous
from extproc.scheduling.prefix_directory import PrefillBacklog, PrefixDirectory
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "prefix-affinity-scorer"
# Prefill backlogs within this many tokens of each other count as equal (then load decides): about a quarter
# of an engine step's token budget.
_BACKLOG_BUCKET = 512.0
# Placements kept for other replicas between two exchanges (oldest dropped first).
_OUTBOX_LIMIT = 10_000
NOMINEES = 4  # ranked endpoints a request's anchor nominates when a large pool is scheduled over a sample
RANKS_KEPT = 4096  # anchors whose ranking is remembered per endpoint set (LRU)
POOLS_KEPT = 16  # endpoint sets (pools, versions) with remembered rankings


@dataclass(frozen=True)
class Params:
    anchor_blocks: int = 8  # ~128 tokens: the key whose rendezvous rank breaks ties between equal endpoints
    load_bound: float = 1.5  # hot: load above load_bound x pool average + load_slack
    load_slack: float = 8.0
    # Score of the second choice. In the default profile (weight 3, queue and KV scorers of weight 1 each) the home
    # must outscore the spill by more than those two together (3 x (1 - 0.2) = 2.4 > 2): at 0.5 they sent a
    # request elsewhere whenever the home was the most queued and its KV cache the fullest, which duplicated
    # prefixes exactly when the caches were short (virtual time, 4 engines, 24 x 2,000-token prefixes at 80%:
    # hit rate 0.83 and TTFT p90 197 ms; at 0.2: 0.89 and 44 ms).
    spill_score: float = 0.2
    index_capacity: int = 200_000  # block hashes remembered (least recently used out)
    homes: int = 8  # endpoints remembered per block hash
    prefill_decay_ms: float = 200.0  # time constant of the prefill backlog (0 = backlog not used)
    # A home must have been hot this long before its prefix is placed elsewhere (0: at once): a burst that an
    # engine clears within a few steps is cheaper to wait out than a full prefill of the prefix elsewhere.
    hot_hold_ms: float = 300.0
    spill_rehold: bool = False  # EXPERIMENT: a home a prefix just left restarts its hold
    place_by_count: int = 0  # EXPERIMENT: 1 count before load, 2 count before backlog
    split_share: float = 0.0  # EXPERIMENT
    split_decay_ms: float = 2000.0  # EXPERIMENT
    split_min: float = 0.0  # EXPERIMENT
    quiet_hold_ms: float = -1.0  # EXPERIMENT: the hold while the home's engine has no queue (<0: hot_hold_ms)
    min_blocks: int = 1  # prompts shorter than this many blocks get no affinity

    def __post_init__(self) -> None:
        if self.anchor_blocks < 1 or self.index_capacity < 1 or self.homes < 1 or self.min_blocks < 0:
            raise ValueError("anchor_blocks, index_capacity and homes must be >= 1, min_blocks >= 0")
        if self.load_bound < 1.0 or self.load_slack < 0.0 or self.prefill_decay_ms < 0.0 or self.hot_hold_ms < 0.0:
            raise ValueError("load_bound must be >= 1.0, load_slack, prefill_decay_ms and hot_hold_ms >= 0")
        if not 0.0 <= self.spill_score <= 1.0:
            raise ValueError("spill_score must be in [0, 1]")


class PrefixAffinityScorer:
    needs_prefix = True

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self.directory = PrefixDirectory(params.index_capacity, params.homes)
        self.backlog = PrefillBacklog(params.prefill_decay_ms / 1000.0)
        self._outbox: list[tuple[str, list[int]]] | None = None  # None until a replica exchange asks
        self._unshared = 1  # replicas placing alongside this one without sharing the directory
        self._placed: dict[str, int] = {}
        self._sent = PrefillBacklog(10.0)
        self._tree = PrefillBacklog(60.0)
        self._demand: OrderedDict[int, tuple[float, float]] = OrderedDict()
        self._total = (0.0, 0.0)
        self._hot_since: dict[str, tuple[float, float]] = {}  # address -> (hot since, last seen hot)
        # id(endpoint set) -> (that set, its endpoints by address, anchor -> top NOMINEES of the set)
        self._ranks: OrderedDict[int, tuple[Sequence[Endpoint], dict[str, Endpoint],
                                            OrderedDict[int, list[Endpoint]]]] = OrderedDict()

    def choices(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[int]:
        """Endpoint indexes, best first: the home, then the spill, then the rest."""
        blocks = request.prefix_blocks
        count = len(endpoints)
        loads = [request.load.requests(e, request.now) for e in endpoints]
        hot = self.params.load_bound * sum(loads) / count + self.params.load_slack
        addresses = [e.address for e in endpoints]
        depths = self.directory.match(blocks, addresses)
        depth = [depths.get(a, 0) for a in addresses]
        deepest = max(depth)
        anchor = blocks[min(len(blocks), self.params.anchor_blocks) - 1]
        rank = [rendezvous(anchor, a) for a in addresses]
        if self._unshared > 1:  # alike in every replica: rank decides among the endpoints that are not hot
            backlog = [0] * count
            order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], -rank[i]))
        else:
            backlog = [round(self.backlog.tokens(a, request.now) / _BACKLOG_BUCKET) for a in addresses]
            placed = [self._placed.get(a, 0) for a in addresses]
            if self.params.place_by_count == 1:
                order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], backlog[i], placed[i], loads[i], -rank[i]))
            elif self.params.place_by_count in (6, 7, 8):
                tree = [self._tree.tokens(a, request.now) for a in addresses]
                if self.params.place_by_count == 6:
                    order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], tree[i], -rank[i]))
                elif self.params.place_by_count == 7:
                    order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], backlog[i], tree[i], -rank[i]))
                else:
                    order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], backlog[i], round(tree[i] / 3000), loads[i], -rank[i]))
            elif self.params.place_by_count in (3, 4, 5):
                sent = [self._sent.tokens(a, request.now) for a in addresses]
                if self.params.place_by_count == 3:
                    order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], backlog[i], sent[i], -rank[i]))
                elif self.params.place_by_count == 4:
                    order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], sent[i], backlog[i], -rank[i]))
                else:
                    order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], backlog[i], round(sent[i] / 4), loads[i], -rank[i]))
            elif self.params.place_by_count == 2:
                order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], placed[i], backlog[i], loads[i], -rank[i]))
            else:
                order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], backlog[i], loads[i], -rank[i]))
        # Homes another replica shared are known every `share_every` blocks only: a home that deep counts as deepest.
        near = deepest - self.directory.share_every + 1
        follow = [i for i in range(count) if deepest and depth[i] >= near and not self._held_hot(
            addresses[i], loads[i] > hot, request.now, self._hold(request, endpoints[i]))]
        if follow and self.params.split_share > 0:
            homes = sum(1 for i in range(count) if depth[i] >= near)
            share = self._share(blocks[deepest - 1], request.now) * count
            wanted = 1 + int(share / self.params.split_share)
            if homes < wanted:
                return [i for i in order if depth[i] < near] + [i for i in order if depth[i] >= near]
        if follow:
            home = min(follow, key=lambda i: (loads[i], backlog[i], -rank[i]))
            order.remove(home)
            order.insert(0, home)
        elif deepest and self.params.spill_rehold:
            for i in range(count):
                if depth[i] >= near:
                    self._hot_since[addresses[i]] = (request.now, request.now)
        return order

    def _share(self, key: int, now: float) -> float:
        import math
        tau = self.params.split_decay_ms / 1000.0
        count, at = self._total
        self._total = (count * math.exp(-(now - at) / tau) + 1.0, now)
        mine, at = self._demand.pop(key, (0.0, now))
        mine = mine * math.exp(-(now - at) / tau) + 1.0
        self._demand[key] = (mine, now)
        if len(self._demand) > 4096:
            self._demand.popitem(last=False)
        return mine / self._total[0] if mine >= self.params.split_min else 0.0

    def _hold(self, request: SchedulingRequest, endpoint: Endpoint) -> float:
        quiet = self.params.quiet_hold_ms
        if quiet < 0:
            return self.params.hot_hold_ms / 1000.0
        metrics = request.load.fresh(endpoint, request.now)
        queued = metrics is not None and metrics.waiting > 0
        return (self.params.hot_hold_ms if queued else quiet) / 1000.0

    def _held_hot(self, address: str, hot: bool, now: float, hold: float) -> bool:
        """Whether `address` has been hot for `hold` s (seen hot at every look since; a look more than the hold
        apart starts over)."""
        if not hot:
            self._hot_since.pop(address, None)
            return False
        entry = self._hot_since.get(address)
        if entry is None:
            # An entry not seen hot within the hold counts as absent: drop those (an endpoint that left the
            # pool while hot), so the map holds only endpoints hot lately. Only here: a new hot endpoint is rare.
            self._hot_since = {a: e for a, e in self._hot_since.items() if now - e[1] <= hold}
            entry = (now, now)
        since, seen = entry
        if now - seen > hold:
            since = now
        self._hot_since[address] = (since, now)
        return now - since >= hold

    def score(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        scores = [0.0] * len(endpoints)
        blocks = request.prefix_blocks
        if not blocks or len(blocks) < self.params.min_blocks:
            return scores
        order = self.choices(request, endpoints)
        scores[order[0]] = 1.0
        if len(order) > 1:
            scores[order[1]] = self.params.spill_score
        return scores

    def nominate(self, request: SchedulingRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        """The homes of the request's known prefixes (deepest first) and its anchor's best-ranked endpoints of the
        whole set, so that a sample of a large pool still holds where the prefix is cached and where it would be
        placed (rankings remembered per anchor: not rehashed over every endpoint per request)."""
        blocks = request.prefix_blocks
        if not blocks or len(blocks) < self.params.min_blocks:
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
        homes = self.directory.holders(blocks, self.params.homes)
        return [*top, *(by_address[a] for a in homes if a in by_address)]

    def observe(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        blocks = request.prefix_blocks
        if not blocks or len(blocks) < self.params.min_blocks:
            return
        held, fresh = self.directory.record(blocks, endpoint.address)
        self._sent.add(endpoint.address, 1.0, request.now)
        if held == 0:
            self._placed[endpoint.address] = self._placed.get(endpoint.address, 0) + 1
        uncached = request.prompt_tokens * (1.0 - held / len(blocks))
        self.backlog.add(endpoint.address, uncached, request.now)
        self._tree.add(endpoint.address, uncached, request.now)
        if self._outbox is not None and fresh:
            self._outbox.append((endpoint.address, fresh))
            if len(self._outbox) > _OUTBOX_LIMIT:
                del self._outbox[: len(self._outbox) - _OUTBOX_LIMIT]

    # -- shared with the other service replicas ---------------------------------------------------------
    def unshared_replicas(self, count: int) -> None:
        self._unshared = max(1, count)

    def export_shared(self) -> list[str]:
        """Placements since the last call, as "address hash hash ..." lines (starts recording on first call)."""
        outbox, self._outbox = self._outbox or [], []
        return [" ".join((address, *map(str, hashes))) for address, hashes in outbox]

    def import_shared(self, lines: Sequence[str]) -> int:
        """Learn other replicas' placements; malformed lines are skipped. Returns the lines learned."""
        learned = 0
        for line in lines:
            address, *rest = line.split() or ("",)
            try:
                hashes = [int(h) for h in rest]
            except ValueError:
                continue
            if address and hashes and all(0 <= h < 1 << 32 for h in hashes):
                self.directory.learn(hashes, address)
                learned += 1
        return learned


def create(name: str, parameters: Mapping[str, Any]) -> PrefixAffinityScorer:
    return PrefixAffinityScorer(name, build_params(Params, name, parameters))


def register(registry: PluginRegistry) -> None:
    registry.register(TYPE, create)
