"""Whether a second copy of a prefix would stay cached: the cache-lifetime rule of `prefix-affinity-scorer`'s second
homes (`pair_requests` with `pair_lifetime`).

vLLM's prefix cache is LRU over the KV blocks not in use: a cached prefix survives while fewer tokens than the
engine's KV are touched after its last use. With the characteristic-time approximation of an LRU cache (Che), an
engine's cache lifetime T solves

    KV tokens = W x T + sum over the prompt families i cached there of s_i x (1 - exp(-rate_i x T))

where W is the rate of tokens the engine writes once (uncached prompt tokens and expected output tokens of what the
gateway sent it, and the prompts of families placed there and not asked there again), s_i a family's prefix tokens
and rate_i its request rate there. A family survives when its requests come well within T: P(gap > T) =
exp(-rate_i x T) for Poisson arrivals, so at `margin` x its mean interval it misses about exp(-margin) of the time.
A copy of a paired family is also sent a request at least every `refresh_s` (the scorer's refresh), so it needs at
most `refresh_s` + `margin` intervals of the whole family.

A second home halves the prefix's rate per copy and adds a copy (s, rate / 2) on the target engine, which shortens
that engine's lifetime. `allows` places it only if (a) both copies survive (the target's lifetime with the copy and
the home's lifetime cover what a copy needs), and (b) every family on the target that survives now still does.

**When it decides** (issue 15's uniform, Zipf and mixed workloads at 80%, virtual time, reports/i15-s14/pairs):
a second home pays one full prefill of the prefix, so it is worth placing while the family is new (its first
prefill is paid then anyway) and not later, when that prefill lands in the tail of a busy pool. A family is weighed
from `DECIDE_AGE_S` to `DECIDE_BY_S` after its first request (before: a conversation's next turns, which mark a
conversation family, have not come yet; after: too late to pay for it), once its rate is known
well enough, and at most once per `REFUSED_S`. The rates are empirical-Bayes (Gamma-Poisson) estimates over the
pool's families: each family's few counts are pulled towards the mean family rate as far as the families' rates do
not differ by more than their counts' Poisson noise, and the prior is worth mean^2 / spread requests. A family is
weighed once its counted requests plus the prior's worth reach `DECIDE_AFTER` (its rate then known to about
1 / sqrt(DECIDE_AFTER)): at once where every family is asked alike (uniform popularity), after about
`DECIDE_AFTER` requests of its own where popularity is skewed (Zipf: a tail family lucky in its first seconds would
be paired, and its copies evicted).

**Conversation families** (a request replayed an earlier prompt of the family whole: a conversation's next turn)
are weighed like any other: a second home of a system prompt lets its new conversations spread over two engines
(multi-turn 80%, real runs: TTFT p99 53.7 vs 56.8 ms, requests per engine cv 0.10 vs 0.29; reports/i15-s24). With
`conversations` False they are never paired, the rule until session 24, measured when the benchmark's users took
turns in slot order (reports/i15-s14/pairs).

Bookkeeping per request (`sent`) is O(1): the endpoint's decaying written tokens and the family's decaying count
there. `allows` is O(families counted), at most once per family per `REFUSED_S` plus once per second home placed
(and only while the family is young), so it adds O(1) per request on average. The KV size is the scraped
`vllm:cache_config_info` num_gpu_blocks x block_size; an engine that did not report it is never given a copy.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import TypeVar

from extproc.endpoints import Endpoint

__all__ = ["CacheLife"]

K = TypeVar("K", bound=Hashable)

DECAY_S = 10.0  # time constant of the written tokens and the families' request counts
PROTECTED = 1.0  # families asked at least this many times per lifetime (cached now) must keep `margin` of them
DECIDE_AFTER = 8.0  # a family is weighed once its counted requests plus the prior's worth reach this
DECIDE_AGE_S = 1.2  # a family is weighed from this long after its first request ...
DECIDE_BY_S = 4.0  # ... until this long after it (then never: a later second home costs a prefill in the tail)
REFUSED_S = 30.0  # a family refused a second home is not considered again for this long
FAMILIES_KEPT = 256  # prompt families remembered per endpoint (least recently sent out)
KEYS_KEPT = 8192  # placements not asked again, second homes not sent yet, conversation families (oldest out)
MIN_AGE_S = 1.0  # a family counted for less than this is rated as if counted for this long
FORGOTTEN = 0.05  # a family whose decayed count fell under this is no longer counted as cached there
UNLIKELY = 0.002  # see `_below`
REFRESHED = 1.25  # a family asked this many times more over the pool than at an endpoint has copies there

_Stats = tuple[dict[int, float], dict[int, float], float]  # rate factors, pooled rates, the prior's worth


class CacheLife:
    __slots__ = ("_copies", "_families", "_pending", "_refused", "_talks", "_written", "conversations", "margin",
                 "refresh_s")

    def __init__(self, margin: float, refresh_s: float = math.inf, conversations: bool = True) -> None:
        self.margin = margin
        self.refresh_s = refresh_s
        self.conversations = conversations  # False: a family a conversation's next turn was seen in is never paired
        # address -> (decayed tokens written by requests of families known there, by placements, as of, first)
        self._written: dict[str, tuple[float, float, float, float]] = {}
        # address -> family -> (decayed requests, as of, prefix tokens, first counted)
        self._families: dict[str, OrderedDict[int, tuple[float, float, float, float]]] = {}
        self._refused: OrderedDict[int, float] = OrderedDict()  # family -> refused at (oldest first)
        self._pending: OrderedDict[tuple[str, int], None] = OrderedDict()  # placements not asked there again yet
        self._copies: OrderedDict[tuple[str, int], None] = OrderedDict()  # second homes allowed, not sent yet
        self._talks: OrderedDict[int, None] = OrderedDict()  # families a next turn was seen in (conversations off)

    def sent(self, family: int, address: str, prefix_tokens: float, written_tokens: float, now: float,
             replayed: bool = False) -> None:
        """A request of the prompt `family` (its anchor) went to `address`: `prefix_tokens` of its prompt are the
        family's shared prefix, `written_tokens` (uncached prompt and expected output) the engine writes anew;
        `replayed`: it replays an earlier prompt whole (a conversation's next turn; remembered only where
        conversation families are never paired)."""
        if replayed and not self.conversations:
            _remember(self._talks, family)
        families = self._families.setdefault(address, OrderedDict())
        entry = families.pop(family, None)
        tokens, placed, at, first = self._written.get(address, (0.0, 0.0, now, now))
        keep = math.exp(-max(0.0, now - at) / DECAY_S)
        if entry is None:
            if self._copies.pop((address, family), 0) is None:
                written_tokens = 0.0  # a second home: the family's footprint there, not a one-off write
            else:
                _remember(self._pending, (address, family))
            placed = placed * keep + written_tokens
            tokens *= keep
        else:
            if self._pending.pop((address, family), 0) is None:  # asked again: its placement was its footprint
                placed = max(0.0, placed - entry[2] * math.exp(-max(0.0, at - entry[3]) / DECAY_S))
            tokens = tokens * keep + written_tokens
            placed *= keep
        self._written[address] = (tokens, placed, now, first)
        count = 0.0 if entry is None else entry[0] * math.exp(-max(0.0, now - entry[1]) / DECAY_S)
        families[family] = (count + 1.0, now, prefix_tokens or (entry[2] if entry else 0.0),
                            now if entry is None else entry[3])
        if len(families) > FAMILIES_KEPT:
            families.popitem(last=False)

    def rate(self, family: int, address: str, now: float) -> float:
        """Requests per second of `family` at `address` lately (as counted)."""
        families = self._families.get(address)
        entry = None if families is None else families.get(family)
        return 0.0 if entry is None else _rate(entry[0], now - entry[1], now - entry[3])

    def _count(self, family: int, address: str, now: float) -> float:
        families = self._families.get(address)
        entry = None if families is None else families.get(family)
        return 0.0 if entry is None else entry[0] * math.exp(-max(0.0, now - entry[1]) / DECAY_S)

    def _stats(self, now: float) -> _Stats:
        """Per family, its estimated rate over its counted rate and its estimated rate over the pool, and the
        prior's worth in requests (see the module docstring; inf when the families differ by no more than noise)."""
        totals: dict[int, list[float]] = {}
        for families in self._families.values():
            for family, (count, seen, _, first) in families.items():
                entry = totals.setdefault(family, [0.0, now])
                entry[0] += count * math.exp(-max(0.0, now - seen) / DECAY_S)
                entry[1] = min(entry[1], first)
        rated = {family: (n, DECAY_S * -math.expm1(-max(MIN_AGE_S, now - first) / DECAY_S))
                 for family, (n, first) in totals.items() if n >= FORGOTTEN}
        if len(rated) < 2:
            return {}, {family: n / w for family, (n, w) in rated.items()}, 0.0
        mean = sum(n for n, _ in rated.values()) / sum(w for _, w in rated.values())
        spread = sum((n / w - mean) ** 2 - mean / w for n, w in rated.values()) / len(rated)  # beyond Poisson
        estimates = {family: n / w if _below(n, mean * w) else mean if spread <= 0 else
                     (n + mean * mean / spread) / (w + mean / spread) for family, (n, w) in rated.items()}
        worth = math.inf if spread <= 0 else mean * mean / spread
        return {family: estimates[family] * w / n for family, (n, w) in rated.items()}, estimates, worth

    def _load(self, address: str, now: float, factors: dict[int, float]) -> tuple[float, list[tuple[float, float]]]:
        """The written tokens per second and the (prefix tokens, rate) of each family counted at `address`."""
        tokens, placed, at, first = self._written.get(address, (0.0, 0.0, now, now))
        families = []
        for family, (count, seen, size, since) in self._families.get(address, OrderedDict()).items():
            if count * math.exp(-max(0.0, now - seen) / DECAY_S) >= FORGOTTEN:
                rate = factors.get(family, 1.0) * _rate(count, now - seen, now - since)
                families.append((size, rate))
        return _rate(tokens + placed, now - at, now - first), families

    @staticmethod
    def lifetime(kv_tokens: float, written: float, families: Sequence[tuple[float, float]]) -> float:
        """T with kv_tokens = written x T + sum s x (1 - exp(-rate x T)) (bisection; inf when nothing is written)."""
        if written <= 0:
            return math.inf
        low, high = 0.0, kv_tokens / written
        for _ in range(30):
            mid = (low + high) / 2
            if written * mid + sum(s * -math.expm1(-r * mid) for s, r in families) < kv_tokens:
                low = mid
            else:
                high = mid
        return low

    def allows(self, family: int, prefix_tokens: float, target: Endpoint, homes: Sequence[str], now: float) -> bool:
        """Whether a second home of `family` (`prefix_tokens` long, now at `homes`) on `target` stays cached
        without pushing the target's surviving families out, decided while the family is young (see the module
        docstring)."""
        if now - self._refused.get(family, -math.inf) < REFUSED_S:
            return False
        if not self.conversations and family in self._talks:
            return False
        firsts = [f[family][3] for a in homes if (f := self._families.get(a)) is not None and family in f]
        if not firsts or not DECIDE_AGE_S <= now - min(firsts) <= DECIDE_BY_S:
            return False
        stats = self._stats(now)
        if sum(self._count(family, a, now) for a in homes) + stats[2] < DECIDE_AFTER:
            return False
        if not self._placeable(family, prefix_tokens, target, homes, now, stats):
            self._refused.pop(family, None)
            self._refused[family] = now
            while self._refused and now - next(iter(self._refused.values())) >= REFUSED_S:
                self._refused.popitem(last=False)
            return False
        _remember(self._copies, (target.address, family))
        return True

    def _placeable(self, family: int, prefix_tokens: float, target: Endpoint, homes: Sequence[str], now: float,
                   stats: _Stats) -> bool:
        metrics = target.metrics
        if metrics is None or metrics.num_gpu_blocks <= 0 or not homes:
            return False
        factors, pooled, _ = stats
        rate = factors.get(family, 1.0) * sum(self.rate(family, a, now) for a in homes)
        if rate <= 0:
            return False
        kv = float(metrics.num_gpu_blocks * metrics.block_size)
        interval = self._needed(rate / 2, rate)  # what a copy's lifetime must cover
        home_written, home_families = self._load(homes[0], now, factors)
        if self.lifetime(kv, home_written, home_families) < interval:
            return False
        written, families = self._load(target.address, now, factors)
        before = self.lifetime(kv, written, families)
        after = self.lifetime(kv, written, [*families, (prefix_tokens, rate / 2)])
        if after < interval:
            return False
        needed = 0.0
        for other, (count, seen, _, first) in self._families.get(target.address, OrderedDict()).items():
            if count * math.exp(-max(0.0, now - seen) / DECAY_S) < FORGOTTEN:
                continue
            here = factors.get(other, 1.0) * _rate(count, now - seen, now - first)
            if here * before >= PROTECTED:
                needed = max(needed, self._needed(here, pooled.get(other, 0.0)))
        return needed <= after

    def _needed(self, here: float, total: float) -> float:
        """The lifetime that keeps cached at an endpoint a family asked `here` times per second there and `total`
        over the pool: `margin` intervals there, or for a copy (refreshed) `refresh_s` and `margin` intervals of
        the whole family if less."""
        needed = self.margin / here
        if total > here * REFRESHED:
            needed = min(needed, self.refresh_s + self.margin / total)
        return needed


def _remember(kept: OrderedDict[K, None], key: K) -> None:
    kept.pop(key, None)
    kept[key] = None
    if len(kept) > KEYS_KEPT:
        kept.popitem(last=False)


def _below(count: float, expected: float) -> bool:
    """Whether `count` requests are too few to come from a family asked like the mean one (`expected`): Poisson
    P(X <= count) under `UNLIKELY` (such a family is rated on its own counts, not pulled towards the mean)."""
    if expected > 500:  # (exp underflows) the normal approximation: P(Z < -2.88) = UNLIKELY
        return count < expected - 2.88 * math.sqrt(expected)
    term = total = math.exp(-expected)
    for k in range(1, int(count) + 1):
        term *= expected / k
        total += term
    return total < UNLIKELY


def _rate(count: float, since: float, age: float) -> float:
    """Per second from a count decayed over DECAY_S, `since` its last update, counted for `age`: the
    window a young count covers is shorter than DECAY_S (at least `MIN_AGE_S`)."""
    window = DECAY_S * -math.expm1(-max(MIN_AGE_S, age) / DECAY_S)
    return count * math.exp(-max(0.0, since) / DECAY_S) / window
