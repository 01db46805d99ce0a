"""Where prompts' block chains were sent: the prefix directory behind `prefix-affinity-scorer`.

A prompt's chained block hashes (`extproc.scheduling.prefix`) name its prefixes: hash i stands for the whole
text up to block i. The directory maps a block hash to the endpoints ("homes") that were sent a prompt with
that prefix, most recent last, at most `homes` of them, and keeps at most `capacity` hashes (least recently
used out). Every endpoint holding a prefix of a request's chain, and the depth of its deepest one, is then
read from the chain's homes, and every home of a prefix has (had) it cached. One decision reads its chain once:
the candidates' depths (`match`), the homes to nominate (`holders`) and what the pick already held (`record`)
come from one walk (in C, no Python work per block); a chain followed again only refreshes its recency.

What one service replica learns, the others can learn too: `record` returns the hashes that were new for
that endpoint (every `share_every`-th one and the last, enough to find a chain from any later request that
extends it, to within that many blocks) and `learn` adds such hashes heard from another replica.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice

__all__ = ["PrefillBacklog", "PrefixDirectory"]


class _Walk:
    """One reading of a chain: each endpoint holding some prefix of it and the depth of its deepest one, found in
    C over the whole chain (no Python work per block, only per distinct homes tuple). `match`, `holders` and
    `record` of one decision share it: the directory keeps the last one until a home changes."""

    __slots__ = ("blocks", "complete", "depths", "homes", "tails", "unknown", "version")

    def __init__(self, blocks: Sequence[int], version: int, index: Mapping[int, tuple[str, ...]],
                 share_every: int) -> None:
        self.blocks = blocks
        self.version = version
        self.homes = homes = list(map(index.get, blocks))  # each block's homes as of `version` (None: unknown)
        # Blocks recorded together share one homes tuple (`record` builds each distinct one once), so a chain
        # holds few distinct tuples: each one's deepest position (later positions overwrite). Equal tuples hold
        # the same endpoints: one entry for them is enough. One tuple for the whole chain, or for a known prefix
        # followed by new blocks, is the usual case: told in C without hashing a tuple per block.
        count = len(homes)
        try:
            self.unknown = unknown = homes.index(None)  # the first block without a home (count: none)
        except ValueError:
            self.unknown = unknown = count
        first = homes[0] if count else None
        if homes[:unknown].count(first) == unknown and homes[unknown:].count(None) == count - unknown:
            deepest = {first: unknown - 1} if unknown else {}
            if unknown < count:
                deepest[None] = count - 1
        else:
            deepest = dict(zip(homes, range(count), strict=True))
        self.complete = deepest.pop(None, None) is None  # every block has a home
        positions = sorted(deepest.values(), reverse=True)
        distinct = [homes[position] or () for position in positions]
        # The deepest first; at one depth the most recent home first: the order of reading the chain from its
        # end, an endpoint counted where it first appears.
        depths = _first_depths(positions, distinct, homes, share_every)
        if depths is None:  # rare (a hash collision, a chain trimmed at its start): read block by block instead
            depths = _confirmed_depths(homes, share_every)
        self.depths = depths
        self.tails = {held[-1] for held in distinct}  # the most recent home of each block


def _first_depths(positions: Sequence[int], distinct: Sequence[tuple[str, ...]],
                  homes: Sequence[tuple[str, ...] | None], share_every: int) -> dict[str, int] | None:
    """Each endpoint's depth where it first appears in `distinct` (the deepest first), or None when one of
    them is not confirmed there (a home too at `confirm_depth`): then only a block-by-block reading tells."""
    depths: dict[str, int] = {}
    for position, held in zip(positions, distinct, strict=True):
        check = position // share_every * share_every  # confirm_depth(position + 1)
        confirm = (homes[check - 1] or ()) if check else None
        for address in reversed(held):
            if address not in depths:
                if confirm is not None and address not in confirm:
                    return None
                depths[address] = position + 1
    return depths


def _confirmed_depths(homes: Sequence[tuple[str, ...] | None], share_every: int) -> dict[str, int]:
    """Each endpoint's deepest depth d at which it is a home and also one at `confirm_depth(d)`, read block by
    block from the end of the chain (the deepest first; at one depth, the most recent home first)."""
    depths: dict[str, int] = {}
    for position in range(len(homes) - 1, -1, -1):
        held = homes[position]
        if held is None:
            continue
        check = position // share_every * share_every
        confirm = (homes[check - 1] or ()) if check else None
        for address in reversed(held):
            if address not in depths and (confirm is None or address in confirm):
                depths[address] = position + 1
    return depths


def _leading_run(homes: list[tuple[str, ...] | None], unknown: int, address: str) -> int:
    """How many leading blocks share the first block's homes tuple, `address` its most recent home, up to the
    first unknown block (at `unknown`; 0 when another tuple comes before it: the caller then reads block by
    block)."""
    first = homes[0] if homes else None
    if first is None or first[-1] != address:
        return 0
    return unknown if homes[:unknown].count(first) == unknown else 0


class PrefixDirectory:
    __slots__ = ("_blocks", "_version", "_walked", "capacity", "homes", "share_every")

    def __init__(self, capacity: int, homes: int, share_every: int = 4) -> None:
        self.capacity = capacity
        self.homes = homes
        self.share_every = share_every
        # hash -> homes, most recent last. Tuples of strings, not lists: the garbage collector stops tracking
        # them, so a full collection does not walk the whole directory (16 ms at 200,000 lists, 4.5 ms at as many
        # tuples, measured), a pause every request then in flight would wait for.
        self._blocks: OrderedDict[int, tuple[str, ...]] = OrderedDict()
        self._version = 0  # changes whenever a home does: the cached walk is then read again
        self._walked: _Walk | None = None

    def __len__(self) -> int:
        return len(self._blocks)

    def _walk(self, blocks: Sequence[int]) -> _Walk:
        """The walk of `blocks`: the last one when it read this very tuple (a decision's calls pass the request's
        own) and no home changed since."""
        walked = self._walked
        if (walked is None or walked.blocks is not blocks or walked.version != self._version
                or type(blocks) is not tuple):
            walked = self._walked = _Walk(blocks, self._version, self._blocks, self.share_every)
        return walked

    def match(self, blocks: Sequence[int], present: Iterable[str]) -> dict[str, int]:
        """For each present endpoint holding some prefix of `blocks`: the depth (blocks) of its deepest one.

        A home at depth d counts only if it also holds the same chain at `confirm_depth(d)`: block hashes are
        32 bits, so among the hundred thousand a full directory holds, one of a request's own new blocks (its
        question) now and then equals a hash recorded for another prompt at another endpoint, which would
        otherwise be taken for the request's deepest prefix (measured on issue 15's uniform workload: about one
        request in 1,000 sent away from its prefix's home, a full prefill there). Two collisions in one chain
        that agree on an endpoint are not a concern. `holders` and `record` read depths the same way."""
        depths = self._walk(blocks).depths
        return {address: depths[address] for address in present if address in depths}

    def confirm_depth(self, depth: int) -> int:
        """The depth at which a home at `depth` must hold the same chain (0: none): the last multiple of
        `share_every` below it, a block every home knows, whether it recorded the chain or learned it from
        another replica (every `share_every`-th block and the last)."""
        return (depth - 1) // self.share_every * self.share_every

    def depths(self, blocks: Sequence[int]) -> dict[str, int]:
        """`match` over every endpoint the directory knows (not only the present ones)."""
        return dict(self._walk(blocks).depths)

    def homes_of(self, block: int) -> tuple[str, ...]:
        """The endpoints `block` was sent to, the most recently sent last (without refreshing its recency)."""
        return self._blocks.get(block, ())

    def holders(self, blocks: Sequence[int], limit: int) -> list[str]:
        """Up to `limit` endpoints holding some prefix of `blocks`, the deepest holders first (for a large pool,
        without naming every endpoint as `match` does)."""
        return list(islice(self._walk(blocks).depths, limit))

    def record(self, blocks: Sequence[int], address: str) -> tuple[int, list[int]]:
        """`blocks` were sent to `address`. Returns the depth `address` already held (what `match` would have said
        for it before this call, found in the same pass) and the hashes to share with other replicas: of the
        blocks that were not known at `address` yet, every `share_every`-th one and the last."""
        index = self._blocks
        walked = self._walk(blocks)
        if walked.complete and walked.tails == {address}:  # a chain followed again: only recency changes
            deque(map(index.move_to_end, blocks), 0)
            return len(blocks), []
        self._version += 1
        fresh: list[int] = []
        # A leading run already sent to `address` last (a known prefix followed by new blocks, the usual case):
        # held, nothing to write or share, only its recency refreshed, in C. The loop reads on from its end.
        start = _leading_run(walked.homes, walked.unknown, address)
        deque(map(index.move_to_end, islice(blocks, start)), 0)
        held = start
        had = [True] * start  # whether `address` held each block before this call, as `match` would have seen it
        added: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # id(homes) -> (homes, with `address`)
        alone = (address,)
        for position in range(start, len(blocks)):
            block = blocks[position]
            homes = index.get(block)
            if homes is None:
                index[block] = alone
                known = False
            else:
                known = address in homes
                check = self.confirm_depth(position + 1)
                if known and (not check or had[check - 1]):
                    held = position + 1
                if not known or homes[-1] != address:
                    index[block] = self._add(homes, address, added)
                index.move_to_end(block)
            had.append(known)
            if not known and ((position + 1) % self.share_every == 0 or position == len(blocks) - 1):
                fresh.append(block)
        self._trim()
        return held, fresh

    def learn(self, hashes: Iterable[int], address: str) -> None:
        """Another replica sent prompts with these prefixes to `address`."""
        self._version += 1
        index = self._blocks
        added: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        alone = (address,)
        for block in hashes:
            homes = index.get(block)
            if homes is None:
                index[block] = alone
            elif address not in homes:
                index[block] = self._add(homes, address, added)
        self._trim()

    def _add(self, homes: tuple[str, ...], address: str,
             added: dict[int, tuple[tuple[str, ...], tuple[str, ...]]]) -> tuple[str, ...]:
        """`address` as the most recent home, the oldest dropped beyond `self.homes`: built once per distinct
        `homes` of a call and shared by its blocks (`added` keeps `homes` alive, so no other tuple takes its id)."""
        known = added.get(id(homes))
        if known is not None:
            return known[1]
        kept = (*(h for h in homes if h != address), address)[-self.homes:]
        added[id(homes)] = (homes, kept)
        return kept

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
