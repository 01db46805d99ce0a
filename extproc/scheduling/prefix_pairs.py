"""Second homes for busy shared prefixes: the state behind `prefix-affinity-scorer`'s `pair_requests`.

A prompt prefix that many requests share (a system prompt) is cached on one endpoint, its home. With two homes,
each request of it can go to the one with less prefill work ahead of it (the power of two choices), which takes
the Poisson bunching of new prompts on one engine out of the tail. What that costs: one full prefill of the prefix
on the second endpoint and twice its KV footprint, and a home that a prefix's requests stop reaching is evicted by
the engine's cache without the gateway knowing (its next request there is a full prefill again).

So this state counts, per prefix, the recent requests that shared it (`count`); remembers when each endpoint was
last sent each prompt family (its anchor: `sent`), so that a home left idle for `refresh_s` gets the next request
and stays cached (`stalest`); paces the new second homes (at most one per `every_s`, so that their full prefills
do not make engines queue together); and sums, per endpoint, the prompt tokens of the prefixes first placed there
(`homed`, decaying over a minute), so that second homes go where fewer prefixes live.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from extproc.scheduling.prefix_demand import PrefixDemand
from extproc.scheduling.prefix_directory import PrefillBacklog

__all__ = ["PrefixPairs"]

HOMED_DECAY_S = 60.0  # time constant of the prompt tokens first placed on each endpoint
SENT_KEPT = 8192  # (anchor, endpoint) pairs whose last send is remembered (least recently sent out)


class PrefixPairs:
    __slots__ = ("_counts", "_ends", "_homed", "_paired_at", "_pairs", "_sent", "every_s", "refresh_s", "wanted")

    def __init__(self, wanted: float, decay_s: float, every_s: float, refresh_s: float, capacity: int) -> None:
        self.wanted = wanted
        self.every_s = every_s
        self.refresh_s = refresh_s
        self._counts = PrefixDemand(decay_s, capacity)
        self._homed = PrefillBacklog(HOMED_DECAY_S)
        self._sent: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._paired_at = -float("inf")
        self._ends: OrderedDict[int, None] = OrderedDict()
        self._pairs: OrderedDict[int, None] = OrderedDict()  # chain keys of the prefixes given a second home

    def count(self, keys: Sequence[int], now: float) -> bool:
        """Count one request whose deepest known prefix ends at one of `keys` (the last blocks of its chain that
        its homes hold, so that requests differing by a first word of their question count for the same prefix);
        whether a second home is due: one of them reached `wanted` requests and none was placed within
        `every_s`."""
        if keys and keys[-1] in self._ends:
            return False
        most = 0.0
        for key in keys:
            self._counts.count(key, now)
            most = max(most, self._counts.requests(key, now))
        return most >= self.wanted and now - self._paired_at >= self.every_s

    def ends(self, key: int) -> None:
        self._ends.pop(key, None)
        self._ends[key] = None
        if len(self._ends) > SENT_KEPT:
            self._ends.popitem(last=False)

    def replays(self, blocks: Sequence[int], held: int) -> bool:
        """Whether a prompt whose first `held` `blocks` its endpoint holds replays an earlier prompt whole (a
        conversation's next turn)."""
        return held > 0 and blocks[held - 1] in self._ends

    def paired(self, keys: Sequence[int], now: float) -> None:
        """A second home was placed now for the prefix whose chain's last blocks are `keys`."""
        self._paired_at = now
        for key in keys:
            self._pairs.pop(key, None)
            self._pairs[key] = None
        while len(self._pairs) > SENT_KEPT:
            self._pairs.popitem(last=False)

    def is_paired(self, keys: Sequence[int]) -> bool:
        """Whether a second home was placed for a prefix ending at one of `keys` (other prefixes with several
        homes, split by demand or moved off a hot home, are followed as without pairs)."""
        return any(key in self._pairs for key in keys)

    def sent(self, anchor: int, address: str, now: float, new_home_tokens: float) -> None:
        """A prompt of the family `anchor` was sent to `address`; `new_home_tokens`: its prompt tokens when nothing
        of it was held there (a prefix placed there), else 0."""
        key = (anchor, address)
        self._sent.pop(key, None)
        self._sent[key] = now
        if len(self._sent) > SENT_KEPT:
            self._sent.popitem(last=False)
        if new_home_tokens > 0:
            self._homed.add(address, new_home_tokens, now)

    def homed(self, address: str, now: float) -> float:
        return self._homed.tokens(address, now)

    def last_sent(self, anchor: int, address: str) -> float:
        return self._sent.get((anchor, address), -float("inf"))

    def stalest(self, anchor: int, addresses: Sequence[str], now: float) -> int | None:
        """The index of the endpoint in `addresses` sent the family `anchor` longest ago, when that is more than
        `refresh_s` ago (never counts as long ago); None otherwise."""
        last = [self._sent.get((anchor, a), -float("inf")) for a in addresses]
        oldest = min(range(len(addresses)), key=last.__getitem__)
        return oldest if now - last[oldest] > self.refresh_s else None
