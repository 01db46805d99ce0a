"""prefix-affinity-scorer: send requests that share a prompt prefix to an endpoint caching it, without piling a
hot prefix onto one endpoint.

Placement, in order:
1. Follow: the endpoints the request's deepest known prefix was sent to (its homes, from the prefix directory)
   that are not hot, or not for `hot_hold_ms` yet (a burst an engine clears in a few steps costs less than a
   full prefill elsewhere; uniform 80%, virtual time: p99 74-104 ms at once, 77-93 at 300 ms); the least loaded.
2. Otherwise place: a new prefix, or one whose homes are all hot, goes to an endpoint that is not hot, the one
   holding the deepest shorter prefix first (a conversation whose own endpoint is hot moves to another that
   has its system prompt), then the one with the least prefill backlog (uncached prompt tokens recently sent
   there, decaying), then the least loaded, then by rendezvous rank of the prompt's anchor (its first
   `anchor_blocks` blocks). The next endpoint in the same order is the spill (score `spill_score`).
   Service replicas that do not share their directories (no Redis) place a prefix alike without talking: by
   rendezvous rank among the endpoints that are not hot. Replicas that share them miss the others' last sends
   for a few milliseconds; with `owned_first` each is dealt an even share of the pool's endpoints (`replica_slot`,
   over `SchedulingRequest.pool`) and places a new prefix on one of its own when that one is within one request
   of the least load and one full prefill of this prompt of the least backlog (multi-turn, 3 replicas).
An endpoint is hot when its load (the pool's load model: scraped running + waiting plus what was sent since)
exceeds `load_bound` x the pool's average + `load_slack`. A hot prefix thus gains homes as its traffic needs
them and spreads over them; a cold one keeps one and is never moved by the small load differences a fixed
share of the average would react to (moving a prefix costs a full prefill of it elsewhere).
3. Split by demand: a prefix drawing more than `split_share` endpoints' fair share of the pool's recent requests
   (requests counted per deepest known prefix, decaying with `split_decay_ms`, once `split_min_requests` of
   them were counted) gets one home per `split_share` of it, placed as in 2 among the endpoints that are not its
   homes yet, before any home is hot: the full prefill a second home costs is paid once, not under the load that
   makes the home hot (Zipf and drift; reports/routing-s9/drift).
4. Second homes (`pair_requests`; state in `extproc.scheduling.prefix_pairs`): while
   the pool's average load is at least `pair_load`, a prefix that a second request branches off (not a
   conversation's next turn, which replays an earlier prompt whole) gets a second home, placed as in 2 on the
   endpoint holding the fewest prompt tokens of prefixes placed there; its requests then go to the home with the
   least prefill backlog (power of two choices), and a home not sent its prompt family for `pair_refresh_ms`
   gets the next one, so that its engine keeps it cached: the Poisson bunching of new prompts on one engine
   leaves the tail where every prefix is evenly asked (reports/i15-s12/u80b). The copies' KV is what workloads
   with cache pressure lack (mixed 80%): the cache-lifetime rule (`pair_lifetime`, `extproc.scheduling.cache_life`)
   places one only where both copies stay cached, while the family is young (i15-s14/pairs), a conversation family
   too (`pair_conversations`: multi-turn's system prompts spread, i15-s24); the KV-room gate (`pair_shortfall`,
   `extproc.scheduling.kv_room`, off) stops pairing while engines evict. Replicas sharing
   placements also replay each other's requests (`extproc.scheduling.prefix_sent`), so each decides as one replica
   routing everything would, a few milliseconds late (virtual time, 3 replicas, uniform 80%: p90 48.8 ms, one
   replica 46.1, none paired 51.8; i15-s16/mirror). Replicas sharing nothing place none.

A pool larger than `scheduling.max_candidates` is scheduled over a sample that `nominate` makes hold the homes
of the request's known prefixes and the anchor's best-ranked endpoints of the whole pool. The directory is
learned from where requests were sent (`observe`); replicas share it through Redis (`extproc.server.placements`,
`export_shared` / `import_shared`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.endpoints import Endpoint
from extproc.scheduling.cache_life import CacheLife
from extproc.scheduling.framework import SchedulingRequest
from extproc.scheduling.hot_hold import HotHold
from extproc.scheduling.kv_room import KvRoom
from extproc.scheduling.pool_views import PoolViews
from extproc.scheduling.prefix import DEFAULT_BLOCK_CHARS, rendezvous
from extproc.scheduling.prefix_demand import PrefixDemand
from extproc.scheduling.prefix_directory import PrefillBacklog, PrefixDirectory
from extproc.scheduling.prefix_pairs import PrefixPairs
from extproc.scheduling.prefix_sent import SENT_MARK, Sent
from extproc.scheduling.registry import PluginRegistry, build_params

TYPE = "prefix-affinity-scorer"
# Prefill backlogs within this many tokens of each other count as equal (then load decides): about a quarter
# of an engine step's token budget.
_BACKLOG_BUCKET = 512.0
# Placements and requests kept for other replicas between two exchanges (oldest dropped first).
_OUTBOX_LIMIT = 10_000
# Another replica's request older than this when it arrives (a starting replica reading the retained exchange) is
# not replayed: only its placement is learned.
REPLAY_WITHIN_S = 1.0
DEMAND_KEPT = 4096  # prefixes whose recent requests are counted for the split (LRU)
BLOCK_TOKENS = DEFAULT_BLOCK_CHARS / 4  # prompt tokens a prefix block covers (~4 characters a token)


@dataclass(frozen=True)
class Params:
    anchor_blocks: int = 8  # ~128 tokens: the key whose rendezvous rank breaks ties between equal endpoints
    load_bound: float = 1.5  # hot: load above load_bound x pool average + load_slack
    load_slack: float = 8.0
    # Score of the second choice: in the default profile (weight 3; queue and KV scorers weight 1 each) the home
    # must outscore the spill by more than those two (3 x 0.8 > 2); at 0.5 prefixes were duplicated exactly when
    # caches were short (virtual time, 4 engines, 24 x 2,000-token prefixes at 80%: hit 0.83 vs 0.89).
    spill_score: float = 0.2
    index_capacity: int = 200_000  # block hashes remembered (least recently used out)
    homes: int = 8  # endpoints remembered per block hash
    prefill_decay_ms: float = 200.0  # time constant of the prefill backlog (0 = backlog not used)
    # A home must have been hot this long before its prefix is placed elsewhere (0: at once): a burst that an
    # engine clears within a few steps is cheaper to wait out than a full prefill of the prefix elsewhere.
    hot_hold_ms: float = 300.0
    # Split by demand (0: off): a prefix with more than split_share / endpoints of the pool's recent requests
    # gets a home per split_share of them. Zipf 1.1 over 48 prefixes on 8 endpoints: the hottest draws 2.1
    # endpoints' share, the next 0.98. At 1.5 the next one's estimate now and then crossed it at 80% load (an
    # extra full prefill: virtual time, TTFT p99 252 vs 232 ms in one seed of four); 1.75 splits the hottest only.
    split_share: float = 1.75
    split_decay_ms: float = 2000.0  # time constant of the request counts
    split_min_requests: float = 16.0  # a prefix is split only once this many of its requests are counted
    min_blocks: int = 1  # prompts shorter than this many blocks get no affinity
    # Second homes (0: off; see 4. in the module docstring): a prefix whose chain's last blocks drew this many
    # recent requests (decaying with pair_decay_ms) while the pool's average load is at least pair_load requests
    # gets a second home, at most one new one per pair_every_ms; a home of a paired prefix not sent its prompt family
    # for pair_refresh_ms gets the next request.
    pair_requests: float = 1.0
    pair_decay_ms: float = 10000.0
    pair_load: float = 6.0
    pair_every_ms: float = 50.0
    pair_refresh_ms: float = 2500.0
    # KV-room gate (0: off; see 4.): the hit-fraction shortfall that counts as eviction, the calm that clears it.
    pair_shortfall: float = 0.0
    pair_hold_ms: float = 10000.0
    pair_lifetime: float = 3.0  # cache-lifetime rule (0: off; see 4.): copies' request intervals per lifetime
    pair_conversations: bool = True  # the rule may pair conversation families too (False: never; see 4.)
    # With several replicas sharing placements: a new prefix goes first to an endpoint dealt to this replica when
    # it is within one request and one prefill of this prompt of the best (see the module docstring).
    owned_first: bool = True

    def __post_init__(self) -> None:
        if self.anchor_blocks < 1 or self.index_capacity < 1 or self.homes < 1 or self.min_blocks < 0:
            raise ValueError("anchor_blocks, index_capacity and homes must be >= 1, min_blocks >= 0")
        if self.load_bound < 1.0 or self.load_slack < 0.0 or self.prefill_decay_ms < 0.0 or self.hot_hold_ms < 0.0:
            raise ValueError("load_bound must be >= 1.0, load_slack, prefill_decay_ms and hot_hold_ms >= 0")
        if not 0.0 <= self.spill_score <= 1.0:
            raise ValueError("spill_score must be in [0, 1]")
        if self.split_share < 0.0 or self.split_decay_ms <= 0.0 or self.split_min_requests < 0.0:
            raise ValueError("split_share and split_min_requests must be >= 0, split_decay_ms > 0")
        if min(self.pair_requests, self.pair_load, self.pair_every_ms, self.pair_refresh_ms, self.pair_shortfall,
               self.pair_hold_ms, self.pair_lifetime) < 0.0 or self.pair_decay_ms <= 0.0:
            raise ValueError("pair_requests, pair_load, pair_every_ms, pair_refresh_ms, pair_shortfall, "
                             "pair_hold_ms and pair_lifetime must be >= 0, pair_decay_ms > 0")


class PrefixAffinityScorer:
    needs_prefix = True

    def __init__(self, name: str, params: Params) -> None:
        self.name = name
        self.params = params
        self.directory = PrefixDirectory(params.index_capacity, params.homes)
        self.backlog = PrefillBacklog(params.prefill_decay_ms / 1000.0)
        self.demand = PrefixDemand(params.split_decay_ms / 1000.0, DEMAND_KEPT)
        self.pairs = PrefixPairs(params.pair_requests, params.pair_decay_ms / 1000.0, params.pair_every_ms / 1000.0,
                                 params.pair_refresh_ms / 1000.0, DEMAND_KEPT) if params.pair_requests > 0 else None
        self.room = KvRoom(params.pair_shortfall, params.pair_hold_ms / 1000.0) if (
            self.pairs is not None and params.pair_shortfall > 0) else None
        self.life = CacheLife(params.pair_lifetime, params.pair_refresh_ms / 1000.0, params.pair_conversations) if (
            self.pairs is not None and params.pair_lifetime > 0) else None
        self._outbox: list[tuple[str, list[int]]] | None = None  # None until a replica exchange asks
        self._sent_box: list[tuple[float, Sent]] = []  # (when, request) routed here, for the other replicas
        self._notify: Callable[[], None] = lambda: None  # told when `_sent_box` gains a line (`watch`)
        # What the last decision counted, for its `Sent`: (sequence, second-home keys, split key, paired).
        self._counted: tuple[int, tuple[int, ...], int | None, bool] = (-1, (), None, False)
        self._unshared = 1  # replicas placing alongside this one without sharing the directory
        self._slot = (0, 1)  # (this replica's index, live replicas sharing placements): its share of endpoints
        self._hot = HotHold(params.hot_hold_ms / 1000.0)
        self._views = PoolViews()

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
            tokens = [self.backlog.tokens(a, request.now) for a in addresses]
            backlog = [round(t / _BACKLOG_BUCKET) for t in tokens]
            foreign = self._foreign(request, addresses, loads, tokens)
            order = sorted(range(count), key=lambda i: (loads[i] > hot, -depth[i], foreign[i], backlog[i], loads[i],
                                                        -rank[i]))
        # Homes another replica shared are known every `share_every` blocks only: a home that deep counts as deepest.
        near = deepest - self.directory.share_every + 1
        pairs, room = self.pairs, self.room
        if room is not None:
            room.check(endpoints, request.now)
        counted = blocks[deepest - 1] if deepest else None
        self._counted = (request.sequence, (), counted, False)
        if self._split(counted, request.now, depth, near):
            return [i for i in order if depth[i] < near] + [i for i in order if depth[i] >= near]
        keys = blocks[max(1, near) - 1:deepest]
        # Second homes: replicas sharing nothing place none (each would give a prefix a copy of its own).
        deciding = pairs is not None and deepest > 0 and self._unshared == 1
        if deciding:
            self._counted = (request.sequence, tuple(keys), counted, False)
        if pairs is not None and deciding and self._pair(pairs, keys, blocks, near, request.now, sum(
                loads) / count >= self.params.pair_load and not (room is not None and room.pool_evicting)):
            homed = [pairs.homed(a, request.now) for a in addresses]
            paired = sorted(range(count), key=lambda i: (loads[i] > hot, homed[i], backlog[i], loads[i], -rank[i]))
            paired = [i for i in paired if depth[i] < near] + [i for i in paired if depth[i] >= near]
            if self.life is None or (depth[paired[0]] < near and self.life.allows(
                    anchor, deepest * min(request.prompt_tokens / len(blocks), BLOCK_TOKENS), endpoints[paired[0]],
                    [a for a, d in zip(addresses, depth, strict=True) if d >= near], request.now)):
                pairs.paired(keys, request.now)
                self._counted = (request.sequence, tuple(keys), counted, True)
                return paired
        follow = [i for i in range(count) if deepest and depth[i] >= near and not self._hot.held(
            addresses[i], loads[i] > hot, request.now)]
        if follow:
            if pairs is None or not pairs.is_paired(blocks[max(1, near) - 1:deepest]):
                home = min(follow, key=lambda i: (loads[i], backlog[i], -rank[i]))
            else:
                home = self._pick_home(pairs, request, follow, addresses, depth, loads, rank, anchor)
            order.remove(home)
            order.insert(0, home)
        return order

    def _foreign(self, request: SchedulingRequest, addresses: list[str], loads: list[float],
                 tokens: list[float]) -> list[bool]:
        """Per endpoint, False when a new prefix should go there first: dealt to this replica (the pool's
        endpoints in address order, one each to the live replicas in turn; the candidates when the request names
        no pool) and within what another replica's last sends can hide of the best, one request of the least
        load and one full prefill of this prompt of the least backlog. All False alone or with `owned_first`
        off."""
        index, replicas = self._slot
        if replicas <= 1 or not self.params.owned_first:
            return [False] * len(addresses)
        least_load = min(loads) + 1.0
        least_backlog = min(tokens) + request.prompt_tokens
        dealt = self._views.dealt(request.pool, addresses, index, replicas)
        return [not (own and load <= least_load and backlog <= least_backlog)
                for own, load, backlog in zip(dealt, loads, tokens, strict=True)]

    def _split(self, prefix: int | None, now: float, depth: list[int], near: int) -> bool:
        """Count the request (of its deepest known `prefix`); whether that prefix wants more than its homes (the
        endpoints whose `depth` is at least `near`), counted only when the prefix is a candidate for a split."""
        share = self.params.split_share
        if share <= 0:
            return False
        self.demand.count(prefix, now)
        if prefix is None or self.demand.requests(prefix, now) < self.params.split_min_requests:
            return False
        homes = sum(1 for d in depth if d >= near)
        return homes < 1 + int(self.demand.share(prefix, now) * len(depth) / share)

    def _pair(self, pairs: PrefixPairs, keys: Sequence[int], blocks: Sequence[int], near: int, now: float,
              busy: bool) -> bool:
        """Count the request for its prefix (the chain's blocks from `near` to `deepest`); whether a second home
        is due now: the prefix is asked often enough, the pool is `busy`, and fewer than two endpoints of the whole
        pool hold it (the candidates may lack a saturated home, which must not make a third)."""
        if not pairs.count(keys, now) or not busy:
            return False
        return sum(1 for d in self.directory.depths(blocks).values() if d >= near) < 2

    def _pick_home(self, pairs: PrefixPairs, request: SchedulingRequest, follow: list[int], addresses: list[str],
                   depth: list[int], loads: list[float], rank: list[int], anchor: int) -> int:
        """With second homes on: among the homes to follow, the one with the least prefill backlog (not rounded:
        two homes of a prefix differ by a question or two), the least recently sent this prefix on a tie; but a
        home not sent its prompt family for `pair_refresh_ms` first, so that the engine keeps it cached."""
        room = self.room
        if len(follow) > 1 and room is not None and room.pool_evicting:  # keep to one home, let the other go
            return max(follow, key=lambda i: pairs.last_sent(anchor, addresses[i]))
        if len(follow) > 1:
            stale = pairs.stalest(anchor, [addresses[i] for i in follow], request.now)
            if stale is not None:
                return follow[stale]
        tokens = [self.backlog.tokens(a, request.now) for a in addresses]
        recent = self.directory.homes_of(request.prefix_blocks[min(depth[i] for i in follow) - 1])
        age = {a: n for n, a in enumerate(recent)}  # most recent last
        least = min(follow, key=lambda i: (age.get(addresses[i], -1), -rank[i]))
        best = min(follow, key=lambda i: (tokens[i], loads[i], -rank[i]))
        return least if tokens[least] <= tokens[best] else best

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
        view = self._views(endpoints)
        top = view.nominees(blocks[min(len(blocks), self.params.anchor_blocks) - 1])
        homes = self.directory.holders(blocks, self.params.homes)
        return [*top, *(view.by_address[a] for a in homes if a in view.by_address)]

    def observe(self, request: SchedulingRequest, endpoint: Endpoint) -> None:
        blocks = request.prefix_blocks
        if not blocks or len(blocks) < self.params.min_blocks:
            return
        held, fresh = self.directory.record(blocks, endpoint.address)
        sequence, keys, counted, paired = self._counted
        if sequence != request.sequence:  # (not decided by this plugin's `choices`: nothing counted)
            keys, counted, paired = (), None, False
        sent = Sent(endpoint.address, blocks[min(len(blocks), self.params.anchor_blocks) - 1], request.prompt_tokens,
                    request.prompt_tokens * (1.0 - held / len(blocks)),
                    held * min(request.prompt_tokens / len(blocks), BLOCK_TOKENS), request.max_output_tokens or 0,
                    held > 0, self.pairs is not None and self.pairs.replays(blocks, held), paired, counted, blocks[-1],
                    keys)  # (`replays` before this prompt's end is recorded: a conversation's next turn)
        self._apply(sent, request.now, 1.0)
        if self._outbox is not None:
            if fresh:
                self._outbox.append((endpoint.address, fresh))
            self._sent_box.append((request.now, sent))
            self._notify()
            del self._outbox[:-_OUTBOX_LIMIT]  # (each box by its own length: nothing while within the limit)
            del self._sent_box[:-_OUTBOX_LIMIT]

    def _apply(self, sent: Sent, now: float, backlog_share: float) -> None:
        """What a request sent does to the state (its counts for the split and second homes aside: `choices` counts
        this replica's, `replay` the others'); `backlog_share`: the part of its uncached tokens still ahead."""
        pairs = self.pairs
        if pairs is not None:
            pairs.sent(sent.anchor, sent.address, now, 0.0 if sent.held else sent.prompt_tokens)
            if self.room is not None:
                self.room.sent(sent.anchor, sent.address, sent.prompt_tokens, sent.cached, now)
            if self.life is not None:
                self.life.sent(sent.anchor, sent.address, sent.cached or sent.prompt_tokens,
                               sent.uncached + sent.output_tokens, now, sent.replays)
            pairs.ends(sent.ends)
        self.backlog.add(sent.address, sent.uncached * backlog_share, now)

    def replay(self, sent: Sent, age_s: float, now: float) -> bool:
        """Another replica's request, routed `age_s` ago: counted and applied as if this replica had routed it (its
        backlog discounted by the decay since); one older than `REPLAY_WITHIN_S` is ignored (False)."""
        if age_s > REPLAY_WITHIN_S:
            return False
        if self.params.split_share > 0:
            self.demand.count(sent.counted, now)
        if self.pairs is not None and sent.keys:
            self.pairs.count(sent.keys, now)
            if sent.paired:
                self.pairs.paired(sent.keys, now)
        decay = self.backlog.decay_s
        self._apply(sent, now, math.exp(-age_s / decay) if decay > 0 else 0.0)
        return True

    # -- shared with the other service replicas ---------------------------------------------------------
    def unshared_replicas(self, count: int) -> None:
        self._unshared = max(1, count)

    def replica_slot(self, index: int, count: int) -> None:
        self._slot = (index, count) if 0 <= index < count else (0, 1)

    def export_shared(self, now: float) -> list[str]:
        """Placements since the last call, as "address hash hash ..." lines (starts recording on first call)."""
        outbox, self._outbox = self._outbox or [], []
        return [" ".join((address, *map(str, hashes))) for address, hashes in outbox]

    def export_perishable(self, now: float) -> list[str]:
        """The requests routed since the last call, as `Sent` lines (their age at `now` included)."""
        sent, self._sent_box = self._sent_box, []
        return [request.line(now - at) for at, request in sent]

    def watch(self, notify: Callable[[], None]) -> None:
        self._notify = notify

    def import_shared(self, lines: Sequence[str], now: float, age_s: float = 0.0) -> int:
        """Learn other replicas' placements and replay their requests (exported `age_s` ago); malformed lines are
        skipped. Returns the lines learned (requests too old to replay are not)."""
        learned = 0
        for line in lines:
            if line.startswith(SENT_MARK):
                parsed = Sent.parse(line)
                learned += parsed is not None and self.replay(parsed[0], parsed[1] + max(0.0, age_s), now)
                continue
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
