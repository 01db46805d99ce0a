"""What one request sent did to `prefix-affinity-scorer`'s state, as a line that the other service replicas replay.

A replica sees only the requests Envoy gives it: a third of them with three replicas. The directory of where
prefixes live is shared as placements (`PrefixAffinityScorer.export_shared`), but the rest of the scorer's state is
per request: the prefill backlog sent to each endpoint, the prefixes' recent request counts (split by demand, second
homes), when each endpoint was last sent each prompt family, the cache-lifetime bookkeeping. A second home pays only
when its requests go to the home with less prefill ahead, and that backlog is younger than the exchange period;
a replica that knew a third of it chose no better than by load (reports/i15-s15/flip). So each replica sends, with
its placements, one `Sent` line per request it routed, and the others replay it (`PrefixAffinityScorer.replay`):
every replica then holds about the state one replica routing everything would, late by the exchange (its age
travels with the line, and a backlog that old is discounted by its decay).

Line: `~ AGE_MS ADDRESS ANCHOR PROMPT UNCACHED CACHED OUTPUT FLAGS COUNTED ENDS KEY...` (AGE_MS always with a
decimal point, so that a replica of an earlier version, which reads `ADDRESS HASH...` lines, skips it as malformed).
Everything in a line is checked before it touches any state: another replica's line is input like any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MAX_KEYS", "SENT_MARK", "Sent"]

SENT_MARK = "~"
MAX_KEYS = 64  # chain keys counted per request (the directory shares a chain every few blocks: a handful)
_MAX_TOKENS = 1e9  # tokens a line may claim for one request
_HELD, _REPLAYS, _PAIRED = 1, 2, 4
_HASHES = 1 << 32


@dataclass(frozen=True, slots=True)
class Sent:
    """One request routed to `address`."""

    address: str
    anchor: int  # its prompt family (the anchor block's hash)
    prompt_tokens: float
    uncached: float  # prompt tokens the endpoint had to compute (directory's estimate)
    cached: float  # prompt tokens of the prefix the endpoint held
    output_tokens: float  # the request's output limit (0: none given)
    held: bool  # the endpoint held some of its prefix
    replays: bool  # it replayed an earlier prompt whole (a conversation's next turn)
    paired: bool  # it placed a second home for its prefix
    counted: int | None  # the deepest known prefix's key, counted for the split by demand (None: none known)
    ends: int  # its prompt's last block
    keys: tuple[int, ...]  # the chain keys counted for second homes (empty: not counted)

    def line(self, age_s: float) -> str:
        flags = (_HELD if self.held else 0) | (_REPLAYS if self.replays else 0) | (_PAIRED if self.paired else 0)
        return " ".join((SENT_MARK, f"{max(0.0, age_s) * 1000:.1f}", self.address, str(self.anchor),
                         f"{self.prompt_tokens:.0f}", f"{self.uncached:.0f}", f"{self.cached:.0f}",
                         f"{self.output_tokens:.0f}", str(flags), str(-1 if self.counted is None else self.counted),
                         str(self.ends), *map(str, self.keys[:MAX_KEYS])))

    @staticmethod
    def parse(line: str) -> tuple[Sent, float] | None:
        """The request and the line's age in seconds at export; None when the line is not a valid `Sent` line."""
        fields = line.split()
        if len(fields) < 11 or fields[0] != SENT_MARK or len(fields) > 11 + MAX_KEYS:
            return None
        try:
            age_ms = float(fields[1])
            tokens = [float(f) for f in fields[4:8]]
            flags, counted, anchor, ends = int(fields[8]), int(fields[9]), int(fields[3]), int(fields[10])
            keys = tuple(int(f) for f in fields[11:])
        except ValueError:
            return None
        if not (math.isfinite(age_ms) and age_ms >= 0 and all(math.isfinite(t) and 0 <= t <= _MAX_TOKENS
                                                                for t in tokens)):
            return None
        if not (0 <= flags < 8 and -1 <= counted < _HASHES and 0 <= anchor < _HASHES and 0 <= ends < _HASHES
                and all(0 <= k < _HASHES for k in keys)):
            return None
        prompt, uncached, cached, output = tokens
        return Sent(fields[2], anchor, prompt, uncached, cached, output, bool(flags & _HELD), bool(flags & _REPLAYS),
                    bool(flags & _PAIRED), None if counted < 0 else counted, ends, keys), age_ms / 1000.0
