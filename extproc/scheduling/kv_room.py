"""Whether each endpoint's engine keeps what the gateway sent it: the KV-room gate of `prefix-affinity-scorer`'s
second homes (`pair_requests`).

The prefix directory only learns where prompts were sent; it never hears that an engine evicted them. The engine
says so indirectly: vLLM counts, per request it schedules, the prompt tokens it looked up in its prefix cache
(`vllm:prefix_cache_queries`) and those it found (`vllm:prefix_cache_hits`). The gateway knows, per request it
sent, how much of the prompt the directory said that engine held (`held` blocks at `observe`). An engine whose
hit fraction falls short of the fraction the gateway expected is evicting prompts the gateway still counts on:
there a second copy of a prefix costs KV the engine does not have.

`sent` adds one request's prompt and expected cached tokens to its endpoint's running totals (O(1));
`check`, at most once per `CHECK_S` (per scrape period), reads each endpoint's last scrape and folds the counters'
and the sends' increments since the previous one into windows decaying over `WINDOW_S`. An endpoint is evicting
once its shortfall (expected fraction - hit fraction over the window, after `MIN_QUERIED` tokens) exceeds
`shortfall`, and stays so until the shortfall has stayed under half of it for `hold_s` (hysteresis: the signal
lags the cause by the window, and a second home placed and dropped again costs a full prefill each time).
Fractions, not tokens, are compared, so that the gateway's estimate of a prompt's tokens (characters / 4) and
several service replicas sending to the same engine (each knowing its own sends) do not bias it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from extproc.endpoints import Endpoint

__all__ = ["KvRoom"]

CHECK_S = 0.1  # at most one look at the scrapes per this long (the scrape period)
WINDOW_S = 2.0  # time constant of the compared windows: several scrapes, longer than a request's queueing
MIN_QUERIED = 20_000.0  # tokens the engine must have looked up in the window before its fraction counts
# A prompt family placed on an endpoint this recently may still be queued for its first prefill there: the
# requests following it find nothing cached yet, which is not eviction (their expected hits are not counted).
FRESH_S = 1.0
PLACED_KEPT = 8192  # (family, endpoint) placements remembered (oldest out)


@dataclass(slots=True)
class _Watch:
    """One endpoint: the gateway's totals, the last scrape folded in, the decaying windows, the state."""

    sent: float = 0.0  # prompt tokens sent (gateway estimate), since start
    expected: float = 0.0  # of which the directory said the endpoint held, since start
    folded_at: float = -math.inf  # scraped_at of the last scrape folded in
    base: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # sent, expected, queries, hits then
    window: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # sent, expected, queries, hits (decaying)
    shortfall: float = 0.0
    evicting: bool = False
    calm_since: float = -math.inf  # shortfall under the release level since (while evicting)


class KvRoom:
    __slots__ = ("_checked_at", "_evicting", "_placed", "_watches", "hold_s", "shortfall")

    def __init__(self, shortfall: float, hold_s: float) -> None:
        self.shortfall = shortfall
        self.hold_s = hold_s
        self._watches: dict[str, _Watch] = {}
        self._placed: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._checked_at = -math.inf
        self._evicting = 0  # endpoints evicting now

    def sent(self, family: int, address: str, prompt_tokens: float, expected_tokens: float, now: float) -> None:
        """A request of the prompt `family` (its anchor block) was sent to `address`, expected to find
        `expected_tokens` of its prompt cached (0: the family is placed there now)."""
        watch = self._watches.get(address)
        if watch is None:
            watch = self._watches[address] = _Watch()
        watch.sent += prompt_tokens
        key = (family, address)
        if expected_tokens <= 0:
            self._placed.pop(key, None)
            self._placed[key] = now
            if len(self._placed) > PLACED_KEPT:
                self._placed.popitem(last=False)
        elif now - self._placed.get(key, -math.inf) >= FRESH_S:
            watch.expected += min(prompt_tokens, expected_tokens)

    def evicting(self, address: str) -> bool:
        watch = self._watches.get(address)
        return watch is not None and watch.evicting

    @property
    def pool_evicting(self) -> bool:
        """Whether any endpoint watched is evicting."""
        return self._evicting > 0

    def shortfall_of(self, address: str) -> float:
        watch = self._watches.get(address)
        return 0.0 if watch is None else watch.shortfall

    def check(self, endpoints: Iterable[Endpoint], now: float) -> None:
        """Fold in the scrapes taken since the last check (at most once per `CHECK_S`)."""
        if now - self._checked_at < CHECK_S:
            return
        self._checked_at = now
        for endpoint in endpoints:
            metrics = endpoint.metrics
            watch = self._watches.get(endpoint.address)
            if metrics is None or watch is None or metrics.scraped_at <= watch.folded_at:
                continue
            self._fold(watch, metrics.scraped_at, metrics.prefix_queries, metrics.prefix_hits, now)
        self._evicting = sum(1 for w in self._watches.values() if w.evicting)

    def _fold(self, watch: _Watch, at: float, queries: float, hits: float, now: float) -> None:
        sent, expected, old_queries, old_hits = watch.base
        first = watch.folded_at == -math.inf
        keep = 0.0 if first else math.exp(-max(0.0, at - watch.folded_at) / WINDOW_S)
        watch.folded_at = at
        watch.base = (watch.sent, watch.expected, queries, hits)
        if first or queries < old_queries or hits < old_hits:  # first look, or the engine restarted: a new base
            return
        w_sent, w_expected, w_queries, w_hits = watch.window
        watch.window = (w_sent * keep + watch.sent - sent, w_expected * keep + watch.expected - expected,
                        w_queries * keep + queries - old_queries, w_hits * keep + hits - old_hits)
        w_sent, w_expected, w_queries, w_hits = watch.window
        if w_queries < MIN_QUERIED or w_sent <= 0:
            return
        watch.shortfall = w_expected / w_sent - w_hits / w_queries
        if watch.shortfall > self.shortfall:
            watch.evicting, watch.calm_since = True, math.inf
        elif watch.evicting:
            if watch.shortfall > self.shortfall / 2:
                watch.calm_since = math.inf
            elif watch.calm_since == math.inf:
                watch.calm_since = now
            elif now - watch.calm_since >= self.hold_s:
                watch.evicting = False
