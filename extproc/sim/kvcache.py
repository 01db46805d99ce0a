"""The KV block pool of one replica: prefix-cached blocks with reference counts and LRU eviction.

Blocks come in two kinds. Hashed blocks hold a full block of known tokens and can be shared by any
request whose token chain reaches the same hash; they stay cached after their last user leaves and
are evicted least-recently-freed first. Anonymous blocks hold a partial block or tokens not yet
generated; they are private and freed on release (or promoted to hashed blocks when they filled up).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Allocation", "KVCache"]


@dataclass(frozen=True, slots=True)
class Allocation:
    """The blocks one request holds: shared hashed blocks (chain order) plus private anonymous ones."""

    hashed: tuple[int, ...]
    anonymous: int
    hit_blocks: int


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
        """Blocks some running request holds (what vLLM reports as KV cache usage)."""
        return self._anonymous + len(self._refs) - len(self._evictable)

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

    def allocate(
        self, prompt_hashes: Sequence[int], total_blocks: int, max_hit_blocks: int
    ) -> Allocation | None:
        """Reserve `total_blocks` blocks whose leading ones are `prompt_hashes`; None if they do not fit.

        Only the first `max_hit_blocks` resident blocks count as hits: vLLM always recomputes at least
        the last prompt token, so a fully cached prompt still leaves its last block to compute.
        """
        if len(prompt_hashes) > total_blocks:
            raise ValueError("more prompt blocks than total blocks")
        hit = self.cached_prefix(prompt_hashes[:max_hit_blocks])
        refs = self._refs
        reviving = sum(1 for h in prompt_hashes[:hit] if refs[h] == 0)
        if total_blocks - hit + reviving > self.num_blocks - self.used_blocks:
            return None
        for h in prompt_hashes:
            count = refs.get(h)
            if count is None:
                self._make_room(1)
                refs[h] = 1
                continue
            if count == 0:
                del self._evictable[h]
            refs[h] = count + 1
        anonymous = total_blocks - len(prompt_hashes)
        self._make_room(anonymous)
        self._anonymous += anonymous
        return Allocation(hashed=tuple(prompt_hashes), anonymous=anonymous, hit_blocks=hit)

    def release(self, allocation: Allocation, filled_hashes: Sequence[int] = ()) -> None:
        """Give the blocks back; `filled_hashes` are anonymous blocks that became full and cacheable.

        Blocks are queued for eviction tail first, so a chain's shared head outlives its private tail.
        """
        if len(filled_hashes) > allocation.anonymous:
            raise ValueError("more filled blocks than anonymous blocks")
        self._anonymous -= allocation.anonymous
        refs = self._refs
        evictable = self._evictable
        for h in reversed(filled_hashes):
            if h not in refs:
                refs[h] = 0
                evictable[h] = None
        for h in reversed(allocation.hashed):
            count = refs[h] - 1
            refs[h] = count
            if count == 0:
                evictable[h] = None

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
