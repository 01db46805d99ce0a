"""The KV block pool of one replica: prefix-cached blocks with reference counts and LRU eviction.

Blocks come in two kinds. Hashed blocks hold a full block of known prompt tokens and can be shared by
any request whose token chain reaches the same hash; they stay cached after their last user leaves and
are evicted least-recently-freed first. Anonymous blocks hold a partial block or generated tokens; they
are private and freed on release (or cached as hashed blocks, when they filled up, by `release`).

As in vLLM, a request's table grows step by step (`grow`): the cached prefix and its first prefill chunk
at admission, more blocks as later chunks and generated tokens need them. A block is cacheable as soon as
it is allocated for a step that computes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BlockTable", "KVCache"]


@dataclass(slots=True)
class BlockTable:
    """The blocks one request holds: shared hashed blocks (chain order), then private anonymous ones."""

    hashed: list[int] = field(default_factory=list)
    anonymous: int = 0

    @property
    def size(self) -> int:
        return len(self.hashed) + self.anonymous


class KVCache:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs: dict[int, int] = {}
        # Unreferenced hashed blocks, oldest first: the eviction order.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._anonymous = 0

    @property
    def used_blocks(self) -> int:
        """Blocks some request holds (what vLLM reports as KV cache usage)."""
        return self._anonymous + len(self._refs) - len(self._evictable)

    @property
    def free_blocks(self) -> int:
        """Blocks a new allocation may take (unreferenced cached blocks are evicted for it)."""
        return self.num_blocks - self.used_blocks

    @property
    def cached_blocks(self) -> int:
        """Hashed blocks resident in the pool, referenced or not."""
        return len(self._refs)

    @property
    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of the chain are resident, without touching them."""
        hits = 0
        for h in hashes:
            if h not in self._refs:
                break
            hits += 1
        return hits

    def grow(self, table: BlockTable, blocks: Sequence[int | None]) -> bool:
        """Append `blocks` to `table`: a hash (a full prompt block, shared with any resident copy) or None (an
        anonymous block). Returns False, changing nothing, when the pool cannot hold them."""
        refs = self._refs
        needed = 0
        seen: set[int] = set()
        for h in blocks:
            if h is None or h not in refs:
                needed += 1
            elif refs[h] == 0 and h not in seen:
                needed += 1  # revived from the evictable list: it becomes used again
                seen.add(h)
        if needed > self.free_blocks:
            return False
        anonymous = 0
        for h in blocks:
            if h is None:
                anonymous += 1
                continue
            count = refs.get(h)
            if count is None:
                self._make_room(1)
                refs[h] = 1
            else:
                if count == 0:
                    del self._evictable[h]
                refs[h] = count + 1
            table.hashed.append(h)
        if anonymous:
            self._make_room(anonymous)
            self._anonymous += anonymous
            table.anonymous += anonymous
        return True

    def release(self, table: BlockTable, filled_hashes: Sequence[int] = ()) -> None:
        """Give the table's blocks back; `filled_hashes` are anonymous blocks that filled up and stay cached.

        Blocks are queued for eviction tail first, so a chain's shared head outlives its private tail.
        """
        if len(filled_hashes) > table.anonymous:
            raise ValueError("more filled blocks than anonymous blocks")
        self._anonymous -= table.anonymous
        refs = self._refs
        evictable = self._evictable
        for h in reversed(filled_hashes):
            if h not in refs:
                refs[h] = 0
                evictable[h] = None
        for h in reversed(table.hashed):
            count = refs[h] - 1
            refs[h] = count
            if count == 0:
                evictable[h] = None
        table.hashed = []
        table.anonymous = 0

    def reset(self) -> int:
        """Drop every unreferenced cached block (vLLM's reset_prefix_cache); returns how many."""
        dropped = len(self._evictable)
        for h in self._evictable:
            del self._refs[h]
        self._evictable.clear()
        return dropped

    def _make_room(self, blocks: int) -> None:
        excess = len(self._refs) + self._anonymous + blocks - self.num_blocks
        for _ in range(excess):
            h, _none = self._evictable.popitem(last=False)
            del self._refs[h]
