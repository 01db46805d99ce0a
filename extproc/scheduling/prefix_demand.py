"""How much of a pool's recent traffic each prompt prefix draws: the demand behind `prefix-affinity-scorer`'s split.

Requests are counted per key (a prefix's block hash) and in total, both decaying exponentially with `decay_s`, so
that a key's share is its part of the recent requests whatever the rate. At most `capacity` keys are kept (least
recently counted out); a key dropped and counted again starts from zero, which only delays a split.
"""

from __future__ import annotations

import math
from collections import OrderedDict

__all__ = ["PrefixDemand"]


class PrefixDemand:
    __slots__ = ("_keys", "_total", "capacity", "decay_s")

    def __init__(self, decay_s: float, capacity: int) -> None:
        if decay_s <= 0 or capacity < 1:
            raise ValueError("decay_s must be > 0 and capacity >= 1")
        self.decay_s = decay_s
        self.capacity = capacity
        self._keys: OrderedDict[int, tuple[float, float]] = OrderedDict()  # key -> (requests, as of)
        self._total = (0.0, 0.0)

    def _decayed(self, entry: tuple[float, float], now: float) -> float:
        requests, at = entry
        return requests * math.exp(-max(0.0, now - at) / self.decay_s)

    def count(self, key: int | None, now: float) -> None:
        """One request (of prefix `key`; None: a request with no known prefix, counted in the total only)."""
        self._total = (self._decayed(self._total, now) + 1.0, now)
        if key is None:
            return
        entry = self._keys.pop(key, None)
        self._keys[key] = ((self._decayed(entry, now) if entry else 0.0) + 1.0, now)
        if len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def requests(self, key: int, now: float) -> float:
        """The decayed count of `key`'s requests (0 when not counted or dropped)."""
        entry = self._keys.get(key)
        return self._decayed(entry, now) if entry else 0.0

    def share(self, key: int, now: float) -> float:
        """`key`'s part of all requests counted, in [0, 1]."""
        total = self._decayed(self._total, now)
        return min(1.0, self.requests(key, now) / total) if total > 0 else 0.0

    def __len__(self) -> int:
        return len(self._keys)
