"""Whether a second copy of a prefix would stay cached: the cache-lifetime rule of `prefix-affinity-scorer`'s second
homes (`pair_requests` with `pair_lifetime`).

vLLM's prefix cache is LRU over the KV blocks not in use: a cached prefix survives while fewer tokens than the
engine's KV are touched after its last use. With the characteristic-time approximation of an LRU cache (Che), an
engine's cache lifetime T solves

    KV tokens = W x T + sum over the prompt families i cached there of s_i x (1 - exp(-rate_i x T))

where W is the rate of tokens the engine writes once (uncached prompt tokens and expected output tokens of what the
gateway sent it), s_i a family's prefix tokens and rate_i its request rate there. A family survives when its
requests come well within T: P(gap > T) = exp(-rate_i x T) for Poisson arrivals, so at `margin` x its mean interval
it misses about exp(-margin) of the time.

A second home halves the prefix's rate per copy and adds a copy (s, rate / 2) on the target engine, which shortens
that engine's lifetime. `allows` places it only if (a) both copies, at half the rate, survive (margin x 2 / rate <=
the target's lifetime with the copy and the home's lifetime), and (b) every family on the target that survives now
still survives with the copy.

Counts younger than the decay are rated over the time they cover. W counts the writes of families known at the
engine that way, and a family's first request there (its placement: a one-off in a warm-up, a steady stream where
new documents keep arriving) over the plain decay. A family is weighed once `DECIDE_AFTER` of its requests are
counted (a rate from one or two requests paired mixed 80%'s documents in its first seconds); a refused family stays
refused for `REFUSED_S` (not retried with every request: a second home placed later, under load, costs a full
prefill in the tail, and the estimates wander around the threshold).

Bookkeeping per request (`sent`) is O(1): the endpoint's decaying written tokens and the family's decaying count
there. `allows` is O(families on the target), at most once per family per `REFUSED_S` plus once per second home
placed, so it adds O(1) per request on average. The KV size is the scraped
`vllm:cache_config_info` num_gpu_blocks x block_size; an engine that did not report it is never given a copy.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from extproc.endpoints import Endpoint

__all__ = ["CacheLife"]

DECAY_S = 10.0  # time constant of the written tokens and the families' request counts
PROTECTED = 1.0  # families asked at least this many times per lifetime (cached now) must keep `margin` of them
DECIDE_AFTER = 4.0  # a family's rate is weighed once this many of its requests are counted (before: not yet)
REFUSED_S = 30.0  # a family refused a second home is not considered again for this long
FAMILIES_KEPT = 256  # prompt families remembered per endpoint (least recently sent out)
MIN_AGE_S = 1.0  # a family counted for less than this is rated as if counted for this long
FORGOTTEN = 0.05  # a family whose decayed count fell under this is no longer counted as cached there


class CacheLife:
    __slots__ = ("_families", "_refused", "_written", "margin")

    def __init__(self, margin: float) -> None:
        self.margin = margin
        # address -> (decayed tokens written by requests of families known there, by placements, as of, first)
        self._written: dict[str, tuple[float, float, float, float]] = {}
        # address -> family -> (decayed requests, as of, prefix tokens, first counted)
        self._families: dict[str, OrderedDict[int, tuple[float, float, float, float]]] = {}
        self._refused: OrderedDict[int, float] = OrderedDict()  # family -> refused at (oldest first)

    def sent(self, family: int, address: str, prefix_tokens: float, written_tokens: float, now: float) -> None:
        """A request of the prompt `family` (its anchor) went to `address`: `prefix_tokens` of its prompt are the
        family's shared prefix, `written_tokens` (uncached prompt and expected output) the engine writes anew."""
        families = self._families.setdefault(address, OrderedDict())
        entry = families.pop(family, None)
        tokens, placed, at, first = self._written.get(address, (0.0, 0.0, now, now))
        keep = math.exp(-max(0.0, now - at) / DECAY_S)
        self._written[address] = (tokens * keep + (written_tokens if entry is not None else 0.0),
                                  placed * keep + (written_tokens if entry is None else 0.0), now, first)
        count = 0.0 if entry is None else entry[0] * math.exp(-max(0.0, now - entry[1]) / DECAY_S)
        families[family] = (count + 1.0, now, prefix_tokens or (entry[2] if entry else 0.0),
                            now if entry is None else entry[3])
        if len(families) > FAMILIES_KEPT:
            families.popitem(last=False)

    def rate(self, family: int, address: str, now: float) -> float:
        """Requests per second of `family` at `address` lately."""
        families = self._families.get(address)
        entry = None if families is None else families.get(family)
        return 0.0 if entry is None else _rate(entry[0], now - entry[1], now - entry[3])

    def _count(self, family: int, address: str, now: float) -> float:
        families = self._families.get(address)
        entry = None if families is None else families.get(family)
        return 0.0 if entry is None else entry[0] * math.exp(-max(0.0, now - entry[1]) / DECAY_S)

    def _load(self, address: str, now: float) -> tuple[float, list[tuple[float, float]]]:
        """The written tokens per second and the (prefix tokens, rate) of each family counted at `address`."""
        tokens, placed, at, first = self._written.get(address, (0.0, 0.0, now, now))
        written = _rate(tokens, now - at, now - first) + placed * math.exp(-max(0.0, now - at) / DECAY_S) / DECAY_S
        families = []
        for count, seen, size, first in self._families.get(address, OrderedDict()).values():
            if count * math.exp(-max(0.0, now - seen) / DECAY_S) >= FORGOTTEN:
                families.append((size, _rate(count, now - seen, now - first)))
        return written, families

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
        without pushing the target's surviving families out (see the module docstring)."""
        if now - self._refused.get(family, -math.inf) < REFUSED_S or sum(
                self._count(family, a, now) for a in homes) < DECIDE_AFTER:
            return False
        if not self._placeable(family, prefix_tokens, target, homes, now):
            self._refused.pop(family, None)
            self._refused[family] = now
            while self._refused and now - next(iter(self._refused.values())) >= REFUSED_S:
                self._refused.popitem(last=False)
            return False
        return True

    def _placeable(self, family: int, prefix_tokens: float, target: Endpoint, homes: Sequence[str],
                   now: float) -> bool:
        metrics = target.metrics
        if metrics is None or metrics.num_gpu_blocks <= 0 or not homes:
            return False
        rate = sum(self.rate(family, a, now) for a in homes)
        if rate <= 0:
            return False
        kv = float(metrics.num_gpu_blocks * metrics.block_size)
        interval = self.margin * 2.0 / rate  # what a copy's lifetime must cover at half the rate
        home_written, home_families = self._load(homes[0], now)
        if self.lifetime(kv, home_written, home_families) < interval:
            return False
        written, families = self._load(target.address, now)
        before = self.lifetime(kv, written, families)
        after = self.lifetime(kv, written, [*families, (prefix_tokens, rate / 2)])
        if after < interval:
            return False
        rarest = min((r for _, r in families if r * before >= PROTECTED), default=math.inf)
        return self.margin / rarest <= after


def _rate(count: float, since: float, age: float) -> float:
    """Per second from a count decayed over DECAY_S, `since` its last update, counted for `age`: the
    window a young count covers is shorter than DECAY_S (at least `MIN_AGE_S`)."""
    window = DECAY_S * -math.expm1(-max(MIN_AGE_S, age) / DECAY_S)
    return count * math.exp(-max(0.0, since) / DECAY_S) / window
