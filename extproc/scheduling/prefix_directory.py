"""Where prompts' block chains were sent: the prefix directory behind `prefix-affinity-scorer`.

A prompt's chained block hashes (`extproc.scheduling.prefix`) name its prefixes: hash i stands for the whole
text up to block i. The directory maps a block hash to the endpoints ("homes") that were sent a prompt with
that prefix, most recent last, at most `homes` of them, and keeps at most `capacity` hashes (least recently
used out). A request's deepest prefix with a home is then found by probing its own chain from the end, and
every home of it has (had) that prefix cached.

What one service replica learns, the others can learn too: `record` returns the hashes that were new for
that endpoint (every `share_every`-th one and the last, enough to find a chain from any later request that
extends it, to within that many blocks) and `learn` adds such hashes heard from another replica.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["PrefillBacklog", "PrefixDirectory"]


class PrefixDirectory:
    __slots__ = ("_blocks", "capacity", "homes", "share_every")

    def __init__(self, capacity: int, homes: int, share_every: int = 4) -> None:
        self.capacity = capacity
        self.homes = homes
        self.share_every = share_every
        # hash -> homes, most recent last. Tuples of strings, not lists: the garbage collector stops tracking
        # them, so a full collection does not walk the whole directory (16 ms at 200,000 lists, 4.5 ms at as many
        # tuples, measured), a pause every request then in flight would wait for.
        self._blocks: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, blocks: Sequence[int], present: Iterable[str]) -> dict[str, int]:
        """For each present endpoint holding some prefix of `blocks`: the depth (blocks) of its deepest one.

        A home at depth d counts only if it also holds the same chain at `confirm_depth(d)`: block hashes are
        32 bits, so among the hundred thousand a full directory holds, one of a request's own new blocks (its
        question) now and then equals a hash recorded for another prompt at another endpoint, which would
        otherwise be taken for the request's deepest prefix (measured on issue 15's uniform workload: about one
        request in 1,000 sent away from its prefix's home, a full prefill there). Two collisions in one chain
        that agree on an endpoint are not a concern."""
        wanted = set(present)
        found: dict[str, int] = {}
        index = self._blocks
        for depth in range(len(blocks), 0, -1):
            homes = index.get(blocks[depth - 1])
            if homes is None:
                continue
            check = self.confirm_depth(depth)
            confirm = index.get(blocks[check - 1], ()) if check else None
            for address in homes:
                if address in wanted and address not in found and (confirm is None or address in confirm):
                    found[address] = depth
            if len(found) == len(wanted):
                break
        return found

    def confirm_depth(self, depth: int) -> int:
        """The depth at which a home at `depth` must hold the same chain (0: none): the last multiple of
        `share_every` below it, a block every home knows, whether it recorded the chain or learned it from
        another replica (every `share_every`-th block and the last)."""
        return (depth - 1) // self.share_every * self.share_every

    def holders(self, blocks: Sequence[int], limit: int) -> list[str]:
        """Up to `limit` endpoints holding some prefix of `blocks`, the deepest holders first (for a large pool,
        without naming every endpoint as `match` does)."""
        found: dict[str, None] = {}
        index = self._blocks
        for depth in range(len(blocks), 0, -1):
            homes = index.get(blocks[depth - 1])
            if homes is None:
                continue
            for address in reversed(homes):
                found.setdefault(address)
            if len(found) >= limit:
                break
        return list(found)[:limit]

    def record(self, blocks: Sequence[int], address: str) -> tuple[int, list[int]]:
        """`blocks` were sent to `address`. Returns the depth `address` already held (what `match` would have said
        for it before this call, found in the same pass) and the hashes to share with other replicas: of the
        blocks that were not known at `address` yet, every `share_every`-th one and the last."""
        index = self._blocks
        fresh: list[int] = []
        held = 0
        had: list[bool] = []  # whether `address` held each block before this call, as `match` would have seen it
        for position, block in enumerate(blocks):
            homes = index.get(block)
            if homes is None:
                index[block] = (address,)
                known = False
            else:
                known = address in homes
                check = self.confirm_depth(position + 1)
                if known and (not check or had[check - 1]):
                    held = position + 1
                if not known or homes[-1] != address:
                    index[block] = self._add(homes, address)
                index.move_to_end(block)
            had.append(known)
            if not known and ((position + 1) % self.share_every == 0 or position == len(blocks) - 1):
                fresh.append(block)
        self._trim()
        return held, fresh

    def learn(self, hashes: Iterable[int], address: str) -> None:
        """Another replica sent prompts with these prefixes to `address`."""
        index = self._blocks
        for block in hashes:
            homes = index.get(block)
            if homes is None:
                index[block] = (address,)
            elif address not in homes:
                index[block] = self._add(homes, address)
        self._trim()

    def _add(self, homes: tuple[str, ...], address: str) -> tuple[str, ...]:
        """`address` as the most recent home, the oldest dropped beyond `self.homes`."""
        kept = (*(h for h in homes if h != address), address)
        return kept[-self.homes:]

    def _trim(self) -> None:
        index = self._blocks
        while len(index) > self.capacity:
            index.popitem(last=False)


class PrefillBacklog:
    """Prompt tokens sent to each endpoint that it had to compute (not cached), decaying exponentially with
    `decay_s`: a proxy for the prefill work still ahead of a new request there, which no scrape shows (vLLM
    reports requests, not the prompt tokens left to compute)."""

    __slots__ = ("_tokens", "decay_s")

    def __init__(self, decay_s: float) -> None:
        self.decay_s = decay_s
        self._tokens: dict[str, tuple[float, float]] = {}  # address -> (tokens, as of)

    def tokens(self, address: str, now: float) -> float:
        entry = self._tokens.get(address)
        if entry is None or self.decay_s <= 0:
            return 0.0
        tokens, at = entry
        return tokens * math.exp(-max(0.0, now - at) / self.decay_s)

    def add(self, address: str, tokens: float, now: float) -> None:
        self._tokens[address] = (self.tokens(address, now) + max(0.0, tokens), now)
