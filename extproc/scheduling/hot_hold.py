"""How long each endpoint has been hot, as `prefix-affinity-scorer` looked: a home's prefix is placed elsewhere
only once its home has been hot for the hold (`hot_hold_ms`), since a burst an engine clears within a few steps
costs less than a full prefill of the prefix elsewhere."""

from __future__ import annotations

__all__ = ["HotHold"]


class HotHold:
    __slots__ = ("hold_s", "since")

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.since: dict[str, tuple[float, float]] = {}  # address -> (hot since, last seen hot)

    def held(self, address: str, hot: bool, now: float) -> bool:
        """Whether `address` has been hot for the hold (seen hot at every look since; a look more than the hold
        apart starts over)."""
        hold = self.hold_s
        if not hot:
            self.since.pop(address, None)
            return False
        entry = self.since.get(address)
        if entry is None:
            # An entry not seen hot within the hold counts as absent: drop those (an endpoint that left the
            # pool while hot), so the map holds only endpoints hot lately. Only here: a new hot endpoint is rare.
            self.since = {a: e for a, e in self.since.items() if now - e[1] <= hold}
            entry = (now, now)
        since, seen = entry
        if now - seen > hold:
            since = now
        self.since[address] = (since, now)
        return now - since >= hold
